"""A real server for the API tests that need real clients: uvicorn in a thread on 127.0.0.1 (a
free port), over an app built by ``create_app``. Real connections, so clients can hang up,
send ``HEAD`` or invented methods, and use their own SDKs against it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serve(app: Any, *, ready: bool = True) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL (``http://127.0.0.1:PORT``).

    Args:
        app: The ASGI app.
        ready: Wait until ``GET /health`` says ``ok`` (models loaded) before yielding.

    uvicorn does not configure logging here (``log_config=None``), so its records reach the
    root logger (and pytest's ``caplog``).
    """
    import httpx
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, log_level="info", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="live-test-server")
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise AssertionError("the test server did not start")
            time.sleep(0.02)
        while ready:
            if httpx.get(f"{base}/health", timeout=5, trust_env=False).status_code == 200:
                break
            assert time.monotonic() < deadline, "the test server's models never became ready"
            time.sleep(0.05)
        yield base
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
