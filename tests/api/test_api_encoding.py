"""Compressed request bodies (``Content-Encoding``), decoded by BodyLimitMiddleware: gzip and
deflate on every JSON route, the body limit on the decompressed size (a bomb is a 413), 415
for other encodings, 400 for corrupt data. (/documents: test_api_documents.py.)"""

from __future__ import annotations

import gzip
import json
import time
import zlib

import pytest
from fastapi.testclient import TestClient

from heedrank.api.app import create_app

BODY = {"query": "apples", "documents": ["a long document about apples and orchards", "short", "tiny!"]}
ORDER = [1, 2, 0]  # the fake reranker ranks shorter documents first ("short" and "tiny!" tie: by index)
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def small(settings, pipeline):
    """A client whose body limit is 4096 bytes."""
    with TestClient(create_app(settings.model_copy(update={"max_body_bytes": 4096}), pipeline=pipeline)) as c:
        assert c.app.state.runtime.wait_ready(10)
        yield c


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("GZIP", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", _raw_deflate),  # raw deflate, as some clients send under that name
        ("identity", lambda b: b),
        ("gzip", lambda b: gzip.compress(b[:10]) + gzip.compress(b[10:])),  # two gzip members
    ],
)
def test_compressed_rerank(small, encoding, compress):
    r = small.post("/rerank", content=compress(json.dumps(BODY).encode()),
                   headers={**JSON, "Content-Encoding": encoding})
    assert r.status_code == 200, r.text
    assert [x["index"] for x in r.json()["results"]] == ORDER


def test_streamed_gzip_body_in_small_chunks(small):
    data = gzip.compress(json.dumps(BODY).encode())

    def chunks():  # no Content-Length; one byte first, so the deflate/zlib sniffing must wait
        yield data[:1]
        for i in range(1, len(data), 5):
            yield data[i:i + 5]

    r = small.post("/rerank", content=chunks(), headers={**JSON, "Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert [x["index"] for x in r.json()["results"]] == ORDER


def test_compressed_search(small):
    r = small.post("/search", content=gzip.compress(b'{"query": "apples", "top_k": 3}'),
                   headers={**JSON, "Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert len(r.json()["results"]) == 3
    metrics = small.get("/metrics").text  # counted under its route, not "unmatched"
    assert 'heedrank_requests_total{method="POST",route="/search",status="200"}' in metrics


def test_bomb_is_413_on_the_decompressed_size(small):
    bomb = gzip.compress(json.dumps({"query": "a", "documents": ["x" * 3_000_000]}).encode(), 9)
    assert len(bomb) < 4096  # the compressed body is within the limit
    t0 = time.perf_counter()
    r = small.post("/rerank", content=bomb, headers={**JSON, "Content-Encoding": "gzip"})
    assert r.status_code == 413
    assert r.json() == {"error": "decompressed request body is over the limit of 4096 bytes; send less in one request",
                        "error_type": "payload_too_large"}
    assert time.perf_counter() - t0 < 5
    # just under the limit inflates fine
    fits = json.dumps({"query": "a", "documents": ["x" * 4000]}).encode()
    assert len(fits) <= 4096
    r = small.post("/rerank", content=gzip.compress(fits), headers={**JSON, "Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, br", "gzip, gzip"])
def test_other_encodings_are_415_naming_the_supported_ones(small, encoding):
    r = small.post("/rerank", content=json.dumps(BODY).encode(), headers={**JSON, "Content-Encoding": encoding})
    assert r.status_code == 415
    assert r.json() == {
        "error": f"Content-Encoding {encoding!r} is not supported; send the body uncompressed or compressed with one "
                 "of: gzip, deflate",
        "error_type": "unsupported_media_type",
    }
    assert r.headers["accept-encoding"] == "gzip, deflate"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"this is not gzip", "incorrect header check"),
        (gzip.compress(json.dumps(BODY).encode())[:-12], "the compressed stream is cut short"),
    ],
)
def test_corrupt_gzip_is_400(small, data, why):
    r = small.post("/rerank", content=data, headers={**JSON, "Content-Encoding": "gzip"})
    assert r.status_code == 400
    assert r.json()["error_type"] == "bad_request"
    assert r.json()["error"].startswith("request body is not valid gzip data (")
    assert why in r.json()["error"]
