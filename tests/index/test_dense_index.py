"""heedrank.index.dense (faiss flat / HNSW / IVF) against brute force, padding, deletes, persistence;
index.hashing; encoder resolution."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heedrank.errors import ModelLoadError, NotFoundError, ValidationError
from heedrank.protocols import Encoder
from heedrank.index.dense import DenseIndex, DenseParams, auto_nlist
from heedrank.index.encoder import SentenceTransformerEncoder, file_sha256, model_sha256, packaged_model_dir, resolve_model_dir
from heedrank.index.hashing import HashingEncoder


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_search_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    x, q = _unit(rng, 50, 16), _unit(rng, 4, 16)
    ids = np.arange(100, 150, dtype=np.int64)
    idx = DenseIndex(16)
    idx.add(x, ids)
    scores, got = idx.search(q, 5)
    assert scores.shape == got.shape == (4, 5)
    assert scores.dtype == np.float32 and got.dtype == np.int64
    exact = q @ x.T
    for i in range(4):
        order = np.argsort(-exact[i])[:5]
        assert got[i].tolist() == ids[order].tolist()
        np.testing.assert_allclose(scores[i], exact[i, order], rtol=1e-5)


def test_k_larger_than_index_never_leaks_padding() -> None:
    rng = np.random.default_rng(1)
    idx = DenseIndex(8)
    idx.add(_unit(rng, 3, 8), np.array([7, 8, 9]))
    scores, ids = idx.search(_unit(rng, 2, 8), 10)
    assert ids.shape == (2, 3) and (ids >= 0).all() and np.isfinite(scores).all()
    assert sorted(ids[0].tolist()) == [7, 8, 9]
    empty = DenseIndex(8)
    s, i = empty.search(_unit(rng, 2, 8), 10)
    assert s.shape == i.shape == (2, 0)


def test_validation_and_persistence(tmp_path: Path) -> None:
    idx = DenseIndex(4)
    with pytest.raises(ValidationError):
        idx.add(np.ones((2, 3), dtype=np.float32), np.array([0, 1]))
    with pytest.raises(ValidationError):
        idx.add(np.ones((1, 4), dtype=np.float32), np.array([-1]))
    with pytest.raises(ValidationError, match="strictly increasing"):
        idx.add(np.eye(4, dtype=np.float32), np.array([3, 2, 1, 0]))
    idx.add(np.eye(4, dtype=np.float32), np.array([0, 1, 2, 3]))
    with pytest.raises(ValidationError, match="never reused"):
        idx.add(np.eye(4, dtype=np.float32)[:1], np.array([3]))
    idx.save(tmp_path / "vectors.faiss")
    assert [p.name for p in tmp_path.iterdir()] == ["vectors.faiss"]  # no temporary file left
    loaded = DenseIndex.load(tmp_path / "vectors.faiss")
    assert len(loaded) == 4 and loaded.dim == 4 and loaded.kind == "flat"
    np.testing.assert_array_equal(loaded.reconstruct(1), [0, 1, 0, 0])
    scores, ids = loaded.search(np.array([0, 0, 1, 0], dtype=np.float32), 1)
    assert ids.tolist() == [[2]] and scores.tolist() == [[1.0]]
    with pytest.raises(NotFoundError):
        DenseIndex.load(tmp_path / "missing.faiss")
    (tmp_path / "bad.faiss").write_bytes(b"garbage")
    with pytest.raises(NotFoundError):
        DenseIndex.load(tmp_path / "bad.faiss")


def _clustered(rng: np.random.Generator, n: int, d: int, clusters: int = 20) -> np.ndarray:
    centres = rng.standard_normal((clusters, d))
    x = centres[rng.integers(0, clusters, n)] + 0.6 * rng.standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _brute(x: np.ndarray, labels: np.ndarray, q: np.ndarray, k: int, allowed=None) -> list[list[int]]:
    keep = np.ones(len(labels), bool) if allowed is None else np.isin(labels, allowed)
    s = q @ x[keep].T
    return [labels[keep][np.argsort(-row, kind="stable")[:k]].tolist() for row in s]


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_exact_search_and_selectors_every_type(kind: str) -> None:
    rng = np.random.default_rng(3)
    x, q = _clustered(rng, 600, 24), _clustered(rng, 5, 24)
    labels = np.arange(600, dtype=np.int64) * 5 + 7
    idx = DenseIndex.build(x, labels, DenseParams(kind, hnsw_m=8, ef_construction=40, nlist=8, nprobe=2))
    assert idx.kind == kind and len(idx) == 600 and idx.num_live == 600
    np.testing.assert_array_equal(idx.labels(), labels)
    np.testing.assert_allclose(idx.vectors(labels[[3, 9]]), x[[3, 9]], atol=1e-6)
    for allowed in (None, labels[::3], labels[rng.choice(600, 7, replace=False)], labels[:0]):
        allowed = None if allowed is None else np.sort(allowed)
        rows = idx.search_exact(q, 10, allowed=allowed)
        want = _brute(x, labels, q, 10, allowed)
        for (got, scores), exp in zip(rows, want):
            assert got.tolist() == exp
            assert got.dtype == np.int64 and scores.dtype == np.float32 and (got >= 0).all()
            assert np.all(np.diff(scores) <= 1e-6)
        for got, _ in idx.search_ann(q, 10, allowed=allowed, ef_search=200, nprobe=8):
            assert allowed is None or np.isin(got, allowed).all()
            assert len(got) <= 10 and (got >= 0).all()


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_delete_in_place_or_tombstones(kind: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    x, q = _clustered(rng, 300, 16), _clustered(rng, 4, 16)
    labels = np.arange(300, dtype=np.int64)
    idx = DenseIndex.build(x, labels, DenseParams(kind, nlist=4, hnsw_m=8))
    gone = labels[:150:2]
    assert idx.delete(np.concatenate([gone, [10_000]])) == len(gone)  # unknown labels ignored
    assert idx.delete(gone) == 0
    if kind == "hnsw":  # no remove_ids in faiss HNSW: tombstones
        assert len(idx) == 300 and idx.tombstones == frozenset(gone.tolist())
    else:
        assert len(idx) == 300 - len(gone) and not idx.tombstones
    assert idx.num_live == 300 - len(gone)
    live = labels[~np.isin(labels, gone)]
    for rows in (idx.search_exact(q, 20), idx.search_ann(q, 20, ef_search=100, nprobe=4),
                 idx.search_exact(q, 20, allowed=labels[:100])):
        for got, _ in rows:
            assert not np.isin(got, gone).any()
    assert [r[0].tolist() for r in idx.search_exact(q, 5)] == _brute(x, labels, q, 5, live)
    idx.add(x[:2], np.array([400, 401]))
    assert idx.num_live == 302 - len(gone)
    rebuilt = idx.rebuilt()
    assert len(rebuilt) == rebuilt.num_live == idx.num_live and not rebuilt.tombstones
    np.testing.assert_array_equal(rebuilt.labels(), np.concatenate([live, [400, 401]]))
    idx.save(tmp_path / "v.faiss")
    again = DenseIndex.load(tmp_path / "v.faiss", DenseParams(kind, nlist=4, hnsw_m=8, ef_search=33, nprobe=3))
    assert again.kind == kind and len(again) == len(idx)
    assert again.params.ef_search == (33 if kind == "hnsw" else again.params.ef_search)
    assert again.params.nprobe == (3 if kind == "ivf" else again.params.nprobe)


def test_params_validation() -> None:
    with pytest.raises(ValidationError, match="unknown index type"):
        DenseParams("annoy")
    with pytest.raises(ValidationError, match="hnsw_m"):
        DenseParams("hnsw", hnsw_m=0)
    with pytest.raises(ValidationError, match="at least 8 vectors"):
        DenseIndex.build(np.eye(4, dtype=np.float32), np.arange(4), DenseParams("ivf", nlist=8))
    with pytest.raises(ValidationError, match="must be trained"):
        DenseIndex(4, DenseParams("ivf"))
    assert auto_nlist(10) == 1 and auto_nlist(14_485) == 120 and auto_nlist(1_000_000) == 1000
    assert DenseParams.from_dict({**DenseParams("hnsw").to_dict(), "unknown": 1}) == DenseParams("hnsw")


def test_hashing_encoder_is_deterministic_and_normalised() -> None:
    enc = HashingEncoder(32)
    assert isinstance(enc, Encoder)
    a = enc.encode_documents(["apple pie recipe", "car engine", ""])
    b = enc.encode_queries(["apple pie recipe"])
    assert a.shape == (3, 32) and a.dtype == np.float32
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_allclose(np.linalg.norm(a[:2], axis=1), 1.0, rtol=1e-6)
    assert not a[2].any()


def test_encoder_resolution_without_loading(tmp_path: Path) -> None:
    pkg = packaged_model_dir()
    assert (pkg / "model.safetensors").is_file()
    assert resolve_model_dir(None) == pkg == resolve_model_dir("all-MiniLM-L6-v2")
    with pytest.raises(ModelLoadError, match="not a local directory"):
        resolve_model_dir("sentence-transformers/some-hub-model")
    empty = tmp_path / "empty-model"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="no weights"):
        SentenceTransformerEncoder(empty)
    (empty / "model.safetensors").write_bytes(b"abc")
    assert model_sha256(empty) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert file_sha256(empty / "model.safetensors") == model_sha256(empty)
    enc = SentenceTransformerEncoder()  # constructing does not load the model
    assert enc._model is None and enc.name == "all-MiniLM-L6-v2"


def test_default_prefixes(tmp_path: Path) -> None:
    from heedrank.index.encoder import default_prefixes

    assert default_prefixes(None) == ("", "")  # packaged all-MiniLM-L6-v2: symmetric, no prefixes
    for name, expected in [
        ("multilingual-e5-small", ("query: ", "passage: ")),
        ("bge-small-en-v1.5", ("Represent this sentence for searching relevant passages: ", "")),
        ("nomic-embed-text-v1.5", ("search_query: ", "search_document: ")),
        ("my-model", ("", "")),
    ]:
        d = tmp_path / name
        d.mkdir()
        assert default_prefixes(d) == expected, name
    custom = tmp_path / "custom-e5-like"
    custom.mkdir()
    (custom / "config_sentence_transformers.json").write_text(
        '{"prompts": {"query": "Instruct: find papers\\nQuery: ", "document": ""}}'
    )
    assert default_prefixes(custom) == ("Instruct: find papers\nQuery: ", "")
    assert default_prefixes(tmp_path / "missing") == ("", "")


def test_a_query_seen_recently_is_not_encoded_again() -> None:
    """:meth:`SentenceTransformerEncoder.encode_queries` keeps recent queries' vectors (a hybrid
    ``/search`` reads one twice): the second call encodes only the new text, and every row equals
    the text's own vector."""
    enc = SentenceTransformerEncoder()
    calls: list[list[str]] = []

    class Model:  # the encoder's model, counting what it is asked to encode
        def encode(self, texts: list[str], **_: object) -> np.ndarray:
            calls.append(list(texts))
            return np.asarray([[float(len(t)), 1.0] for t in texts], dtype=np.float32)

    enc._model = Model()
    first = enc.encode_queries(["vitamin d", "statins"])
    again = enc.encode_queries(["statins", "fish oil", "vitamin d"])
    assert calls == [["vitamin d", "statins"], ["fish oil"]]
    assert again.tolist() == [first[1].tolist(), [8.0, 1.0], first[0].tolist()] and again.dtype == np.float32
    again[0, 0] = -1.0  # a caller's copy: the kept vector is not changed
    assert enc.encode_queries(["statins"]).tolist() == [[7.0, 1.0]] and len(calls) == 2


def test_auto_index_type_by_size() -> None:
    """``auto`` keeps up to 100k vectors exact and builds IVF above, its cells and probes recorded."""
    from heedrank.index.dense_build import FLAT_MAX

    auto = DenseParams(index_type="auto")
    assert auto.for_size(FLAT_MAX).index_type == "flat"
    big = auto.for_size(1_000_000)
    assert (big.index_type, big.nlist, big.nprobe) == ("ivf", 1000, 62)
    assert DenseParams(index_type="hnsw").for_size(10**7).index_type == "hnsw"  # an explicit type is kept
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 8)).astype(np.float32)
    ix = DenseIndex.build(x / np.linalg.norm(x, axis=1, keepdims=True), np.arange(50, dtype=np.int64), auto)
    assert ix.kind == "flat" and ix.params.index_type == "flat"
    assert DenseIndex(8, auto).kind == "flat"
    with pytest.raises(ValidationError, match="auto"):
        DenseParams(index_type="annoy")


def test_ivf_sq8_storage(tmp_path: Path) -> None:
    """``ivf_storage="sq8"``: one byte a dimension, decoded vectors within 8-bit rounding, search
    close to float32 IVF over the same cells, persisted and read back as sq8; ``auto`` picks it
    above SQ8_MIN vectors only."""
    import faiss

    from heedrank.index.dense_build import SQ8_MIN

    rng = np.random.default_rng(5)
    x, q = _clustered(rng, 2000, 32), _clustered(rng, 20, 32)
    labels = np.arange(2000, dtype=np.int64) * 3
    sq8 = DenseIndex.build(x, labels, DenseParams("ivf", nlist=16, nprobe=16, ivf_storage="sq8"))
    f32 = DenseIndex.build(x, labels, DenseParams("ivf", nlist=16, nprobe=16))
    assert isinstance(sq8.index, faiss.IndexIVFScalarQuantizer) and isinstance(f32.index, faiss.IndexIVFFlat)
    assert (sq8.kind, sq8.params.ivf_storage, f32.params.ivf_storage) == ("ivf", "sq8", "float32")
    assert sq8.describe()["index_type"] == "IndexIVFScalarQuantizer(QT_8bit)"
    assert sq8.memory_bytes() < f32.memory_bytes() / 2
    decoded = sq8.vectors(labels[[0, 7, 1999]])
    cos = (decoded * x[[0, 7, 1999]]).sum(1) / np.linalg.norm(decoded, axis=1)
    assert decoded.dtype == np.float32 and cos.min() > 0.999
    want = [r[0].tolist() for r in f32.search_ann(q, 10)]  # every cell probed: exact for float32
    got = [r[0].tolist() for r in sq8.search_ann(q, 10)]
    recall = np.mean([len(set(g) & set(w)) / 10 for g, w in zip(got, want)])
    assert recall >= 0.95
    exact = [r[0].tolist() for r in sq8.search_exact(q, 5, allowed=labels[:50])]  # over the decoded vectors
    brute = _brute(x, labels, q, 5, labels[:50])
    assert all(set(e) <= set(labels[:50].tolist()) for e in exact)
    assert np.mean([len(set(e) & set(b)) / 5 for e, b in zip(exact, brute)]) >= 0.9
    assert sq8.delete(labels[:10]) == 10 and len(sq8) == 1990
    sq8.save(tmp_path / "v.faiss")
    again = DenseIndex.load(tmp_path / "v.faiss", DenseParams("ivf", nprobe=4))
    assert (again.params.ivf_storage, again.params.nlist, again.params.nprobe) == ("sq8", 16, 4)
    assert [r[0].tolist() for r in again.search_ann(q, 10, nprobe=16)] == [
        r[0].tolist() for r in sq8.search_ann(q, 10)]
    auto = DenseParams(index_type="auto")
    assert auto.for_size(SQ8_MIN).ivf_storage == "float32"
    assert auto.for_size(SQ8_MIN + 1).ivf_storage == "sq8"
    assert auto.for_size(1000).ivf_storage == "float32"  # flat
    assert DenseParams("ivf", ivf_storage="float32").for_size(10**7).ivf_storage == "float32"  # explicit: kept
    with pytest.raises(ValidationError, match="needs an IVF index"):
        DenseParams("hnsw", ivf_storage="sq8")
    with pytest.raises(ValidationError, match="unknown IVF storage"):
        DenseParams("ivf", ivf_storage="pq")


def test_build_streamed_equals_build() -> None:
    """:meth:`DenseIndex.build_streamed` over parts gives :meth:`build`'s index when every vector
    fits in the training sample (flat and IVF: same lists, same scores), and a short or long count
    is refused."""
    rng = np.random.default_rng(11)
    x, q = _clustered(rng, 900, 16), _clustered(rng, 8, 16)
    labels = np.arange(900, dtype=np.int64) * 2 + 5
    cuts = [0, 100, 101, 500, 900]

    def parts() -> list[tuple[np.ndarray, np.ndarray]]:
        return [(x[a:b], labels[a:b]) for a, b in zip(cuts, cuts[1:])]

    for params in (DenseParams("flat"), DenseParams("ivf", nlist=8, nprobe=3), DenseParams("ivf", nlist=8, nprobe=3,
                                                                                            ivf_storage="sq8")):
        whole, streamed = DenseIndex.build(x, labels, params), DenseIndex.build_streamed(parts, 900, params, dim=16)
        assert streamed.params == whole.params and len(streamed) == 900
        np.testing.assert_array_equal(streamed.labels(), whole.labels())
        for (la, sa), (lb, sb) in zip(whole.search_ann(q, 10), streamed.search_ann(q, 10)):
            assert la.tolist() == lb.tolist()
            np.testing.assert_allclose(sa, sb, rtol=1e-6)
    with pytest.raises(ValidationError, match="899"):
        DenseIndex.build_streamed(parts, 899, DenseParams("flat"), dim=16)


def test_build_streamed_trains_ivf_on_a_sample() -> None:
    """Above ``TRAIN_POINTS_PER_CELL`` vectors a cell the IVF index trains on a seeded uniform
    sample of that many (drawn across every part, deterministic), and searches as well as the index
    trained on all of them."""
    from heedrank.index.dense_build import TRAIN_POINTS_PER_CELL, training_sample

    rng = np.random.default_rng(12)
    n, nlist = 3000, 4
    x, q = _clustered(rng, n, 16), _clustered(rng, 200, 16)
    labels = np.arange(n, dtype=np.int64)

    def parts() -> list[tuple[np.ndarray, np.ndarray]]:
        return [(x[a:a + 700], labels[a:a + 700]) for a in range(0, n, 700)]

    sample = training_sample(parts(), n, TRAIN_POINTS_PER_CELL * nlist)
    assert sample.shape == (1024, 16) and sample.dtype == np.float32
    rows = {tuple(r) for r in x.tolist()}
    assert all(tuple(r) in rows for r in sample.tolist())
    np.testing.assert_array_equal(sample, training_sample(parts(), n, 1024))
    assert (sample[:, None, :] == x[2800:][None]).all(-1).any()  # the last part is sampled too
    streamed = DenseIndex.build_streamed(parts, n, DenseParams("ivf", nlist=nlist, nprobe=2), dim=16)
    whole = DenseIndex.build(x, labels, DenseParams("ivf", nlist=nlist, nprobe=2))
    brute = _brute(x, labels, q, 10, labels)
    recall = [np.mean([len(set(r[0].tolist()) & set(b)) / 10 for r, b in zip(ix.search_ann(q, 10), brute)])
              for ix in (whole, streamed)]
    assert abs(recall[1] - recall[0]) <= 0.05 and recall[1] >= 0.8, recall  # 0.887 and 0.887
    with pytest.raises(ValidationError, match="held 3000"):
        training_sample(parts(), n + 1, 10)


def test_build_streamed_resolves_nlist_for_every_vector() -> None:
    """An IVF index without ``nlist`` gets ``auto_nlist`` of all ``n`` vectors, not of the
    training sample's size (20,000 vectors: 141 cells; the sample holds 256 a cell)."""
    rng = np.random.default_rng(13)
    x = _clustered(rng, 20000, 8)
    labels = np.arange(20000, dtype=np.int64)
    ix = DenseIndex.build_streamed(lambda: [(x[:9000], labels[:9000]), (x[9000:], labels[9000:])], 20000,
                                   DenseParams("ivf", nprobe=4), dim=8)
    assert ix.params.nlist == auto_nlist(20000) == 141 and len(ix) == 20000
