"""Typed reranker options: unknown keys refused, types and ranges checked, defaults kept,
checked by the CLI before any model loads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from heedrank.errors import ValidationError
from heedrank.reranker.options import (
    BlockRankOptions,
    ICROptions,
    describe_options,
    parse_options,
)
from heedrank.reranker.reattn import ReAttnConfig


def test_unknown_key_is_refused_with_the_valid_names():
    with pytest.raises(ValidationError) as err:
        parse_options("blockrank", {"lyaer": 18})
    msg = str(err.value)
    assert "'lyaer'" in msg and "did you mean 'layer'" in msg
    for name in BlockRankOptions.names():
        assert name in msg
    with pytest.raises(ValidationError, match="unknown icr option 'layer'"):
        parse_options("icr", {"layer": 18})  # a BlockRank option is not an ICR one


def test_defaults_are_the_former_ones():
    icr = parse_options("icr", {})
    assert (icr.calibration, icr.mask_std, icr.instruction, icr.reverse, icr.chat_template, icr.keep_attention,
            icr.heads, icr.reattn) == (True, 2.0, "ie", True, True, False, "all", None)
    assert (icr.windows, icr.window_tokens, icr.anchors, icr.max_query_tokens) == (True, None, 1, None)
    br = parse_options("blockrank", None)
    assert (br.layer, br.scoring, br.query_offset, br.n_signal, br.chat_template, br.doc_batch_size, br.mask_std,
            br.heads, br.reattn) == (None, "signal", None, 2, True, 64, 2.0, "all", None)
    assert br.doc_labels == "sorted"


@pytest.mark.parametrize("method,options,fragment", [
    ("blockrank", {"layer": -1}, "layer must be an integer >= 0"),
    ("blockrank", {"layer": "18"}, "layer must be an integer"),
    ("blockrank", {"layer": True}, "layer must be an integer"),
    ("blockrank", {"n_signal": 0}, "n_signal must be an integer >= 1"),
    ("blockrank", {"scoring": "max"}, "scoring must be 'signal' or 'calibrated'"),
    ("blockrank", {"heads": "learned"}, "ICR only"),
    ("blockrank", {"heads": "qr", "scoring": "calibrated"}, "need scoring='signal'"),
    ("blockrank", {"doc_labels": "random"}, "doc_labels must be"),
    ("blockrank-cached", {"kv_dtype": "float32"}, "kv_dtype must be"),
    ("blockrank", {"kv_dtype": "int8"}, "unknown blockrank option 'kv_dtype'"),
    ("blockrank-cached", {"scoring": "max"}, "scoring must be 'auto' or 'learned'"),
    ("blockrank-cached", {"query_adapter": ""}, "query_adapter must be"),
    ("icr", {"mask_std": -1}, "mask_std must be a number >= 0"),
    ("icr", {"calibration": "yes"}, "calibration must be true or false"),
    ("icr", {"instruction": "chat"}, "instruction must be 'ie' or 'qa'"),
    ("icr", {"heads": [[1, 2], [3]]}, "heads must be [[layer, head], ...]"),
    ("icr", {"heads": []}, "heads must be one of"),
    ("icr", {"window_tokens": 10}, "window_tokens must be an integer >= 64"),
    ("icr", {"anchors": 0}, "anchors must be an integer >= 1"),
    ("icr", {"reattn": {"idf": True, "bogus": 1}}, "unknown reattn keys"),
])
def test_bad_values_are_refused(method, options, fragment):
    with pytest.raises(ValidationError, match=None) as err:
        parse_options(method, options)
    assert fragment in str(err.value)


def test_values_are_typed_and_report_ready():
    o = parse_options("icr", {"heads": [[12, 0], [3, 1], [3, 1]], "reattn": {"idf": False}, "mask_std": None,
                              "max_query_tokens": 64})
    assert isinstance(o, ICROptions)
    assert o.heads == ((3, 1), (12, 0)) and o.reattn == ReAttnConfig(idf=False, entropy=True, gamma=0.5)
    assert o.mask_std is None and o.max_query_tokens == 64
    d = o.to_dict()
    assert d["heads"] == [[3, 1], [12, 0]] and d["reattn"] == {"idf": False, "entropy": True, "gamma": 0.5}
    assert json.loads(json.dumps(d)) == d  # JSON-ready, every option present
    assert list(d) == ICROptions.names()
    assert parse_options("icr", {"mask_std": 1}).mask_std == 1.0  # an int is a fine float
    assert ICROptions.parse(o) is o


def test_none_takes_no_options_and_plugins_pass_through():
    assert parse_options("none", {}) == {}
    with pytest.raises(ValidationError, match="need a reranking method"):
        parse_options("none", {"layer": 3})
    assert parse_options("my-plugin", {"anything": 1}) == {"anything": 1}


def test_describe_lists_name_type_default_doc():
    info = describe_options()
    assert sorted(info) == ["blockrank", "blockrank-cached", "icr"]
    by_name = {o["name"]: o for o in info["blockrank"]}
    assert by_name["layer"] == {"name": "layer", "type": "int >= 0 | null", "default": None,
                                "doc": by_name["layer"]["doc"]}
    assert "round(0.6" in by_name["layer"]["doc"]
    cached = {o["name"]: o for o in info["blockrank-cached"]}
    assert cached["scoring"]["default"] == "auto" and cached["query_adapter"]["default"] == "auto"
    assert "query_in_instruction" not in by_name and "kv_dtype" not in by_name
    assert {o["name"] for o in info["icr"]} == set(ICROptions.names())
    assert all(o["doc"] and o["type"] for m in info.values() for o in m)


def test_options_import_without_torch_and_cli_refuses_before_loading(tmp_path):
    code = ("import sys\nfrom heedrank.reranker.options import parse_options\n"
            "parse_options('icr', {'heads': 'qr'})\nprint('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    cli = subprocess.run(
        [sys.executable, "-m", "heedrank", "eval", "trec-dl", "--data", str(tmp_path / "missing"),
         "--rerank", "blockrank", "--opt", "lyaer=18"],
        capture_output=True, text=True,
    )
    assert cli.returncode == 2
    assert "unknown blockrank option 'lyaer'" in cli.stderr and "layer" in cli.stderr
    assert "Traceback" not in cli.stderr


def test_learned_scoring_needs_the_cached_prompt():
    from heedrank.errors import ValidationError
    from heedrank.reranker.options import parse_options

    with pytest.raises(ValidationError, match="scoring"):
        parse_options("blockrank", {"scoring": "learned"})
    with pytest.raises(ValidationError, match="unknown blockrank option 'query_in_instruction'"):
        parse_options("blockrank", {"query_in_instruction": False})  # the old spelling is gone: no alias
    assert parse_options("blockrank-cached", {"scoring": "learned"}).scoring == "learned"
    assert parse_options("default", {}) == parse_options("blockrank-cached", {})
