"""``bench/model_shape.py`` (cached BlockRank at a given model shape, random weights) runs at a
tiny shape on CPU and prints its table; the ``7b`` preset is Mistral-7B's shape (never run here)."""

from __future__ import annotations


import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")



@pytest.fixture(scope="module")
def bench():
    from bench_modules import load_bench

    return load_bench("model_shape")


def test_tiny_shape_on_cpu_prints_the_table(bench, capsys) -> None:
    fig = bench.main(["--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--head-dim", "8",
                      "--intermediate", "64", "--vocab", "400", "--blocks", "6", "--candidates", "3,6",
                      "--batch-size", "4", "--rounds", "1", "--torch-threads", "1", "--block-tokens", "32"])
    out = capsys.readouterr().out
    assert "| block encoding (blocks/s, 32 tokens) |" in out and "| store build (blocks/s, int8) |" in out
    assert "| warm query, 3 candidates" in out and "| warm query, 6 candidates" in out and "| peak RSS (MiB) |" in out
    assert fig["layer"] == 1 and fig["peak_gpu_mib"] is None
    assert fig["encode_blocks_per_s"] > 0 and fig["store_blocks_per_s"] > 0 and fig["store_bytes_per_block"] > 0
    assert set(fig["query_s"]) == {3, 6} and all(s > 0 for s in fig["query_s"].values())


def test_independent_scoring_runs_with_a_random_card(bench) -> None:
    fig = bench.main(["--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--head-dim", "8",
                      "--intermediate", "64", "--vocab", "400", "--blocks", "4", "--candidates", "3",
                      "--batch-size", "4", "--rounds", "1", "--torch-threads", "1", "--block-tokens", "32",
                      "--scoring", "independent"])
    assert fig["query_s"][3] > 0 and fig["query_pass_s"][3] > 0


def test_the_7b_preset_is_mistral_7b_and_flags_override_it(bench) -> None:
    shape = bench.resolve_shape(bench.parse_args(["--preset", "7b"]))
    assert (shape.arch, shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate,
            shape.vocab) == ("mistral", 32, 4096, 32, 8, 128, 14336, 32000)
    assert bench.resolve_shape(bench.parse_args(["--preset", "7b", "--layers", "4"])).layers == 4
    with pytest.raises(SystemExit, match="--layers"):
        bench.resolve_shape(bench.parse_args(["--hidden", "64", "--heads", "4"]))
    with pytest.raises(SystemExit, match="multiple"):
        bench.resolve_shape(bench.parse_args(["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "3"]))
