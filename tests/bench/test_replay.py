"""``bench/replay.py`` at a small size (slow: it indexes 40 NFCorpus documents, starts the service
three times and sends about 40 requests): concurrent answers equal their one-at-a-time replays,
no server error, and nothing acknowledged is lost after ``kill -9`` during the fill and during a
burst of upserts."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "replay.py"


@pytest.mark.slow
def test_replay_harness_small(nfcorpus_dir, tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, str(BENCH), "--docs", "40", "--clients", "1,2", "--requests", "10", "--faults",
                          "--port", str(port), "--work", str(tmp_path)], capture_output=True, text=True, timeout=1500)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    rows = [line.split("|") for line in out.stdout.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(rows) >= 2, text[-4000:]
    for row in rows:
        cells = [c.strip() for c in row[1:-1]]
        assert cells[7] == "0" and cells[9] == "0", text[-4000:]  # 5xx + errors, differing
        assert int(cells[8]) >= 1  # compared something
    assert "0 lost" in out.stdout and "answers the same after the restart" in out.stdout
