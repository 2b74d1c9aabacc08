"""Quiet by default: no absolute server paths in /info, library noise and health polls out of the log."""

from __future__ import annotations

import json
import logging

from fastapi.testclient import TestClient

from heedrank.api.app import NOISY_LOGGERS, _HealthPolls, create_app, quiet_library_logs


def test_info_shows_no_absolute_paths(tmp_path):
    from heedrank.index.builder import build_index
    from heedrank.settings import Settings

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "d1", "title": "T", "text": "vitamin d and bones"}) + "\n", encoding="utf-8")
    build_index(corpus, tmp_path / "index", dense=False, show_progress=False)
    settings = Settings(index=str(tmp_path / "index"), rerank_method="none", warmup=False)
    with TestClient(create_app(settings)) as client:
        info = client.get("/info")
    assert info.status_code == 200, info.text
    assert str(tmp_path) not in info.text  # names, not where the server keeps them


def test_health_polls_and_library_noise_are_filtered():
    quiet_library_logs()
    quiet_library_logs()  # idempotent: one filter
    access = logging.getLogger("uvicorn.access")
    assert sum(isinstance(f, _HealthPolls) for f in access.filters) == 1
    poll = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                             ("127.0.0.1:5", "GET", "/health", "1.1", 503), None)
    search = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "POST", "/search", "1.1", 200), None)
    assert not access.filter(poll) and access.filter(search)
    assert all(logging.getLogger(n).getEffectiveLevel() >= logging.WARNING for n in NOISY_LOGGERS)
