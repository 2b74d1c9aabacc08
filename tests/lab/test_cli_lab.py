"""The command line's two halves: ``heedrank`` lists the product commands only, research and
model building is the one group ``heedrank lab``, loaded lazily (``heedrank --help`` imports
none of its modules), and the lab's commands write their records (a weights card, the
cut-off's calibration, each naming the command that wrote it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from heedrank.cli import app

PRODUCT = {"index build", "index info", "index compact", "index stats", "index kv build", "serve", "rerank-batch",
           "eval beir", "eval trec-dl", "eval compare"}
LAB = {"lab dump", "lab fit", "lab calibrate", "lab fit-independent", "lab fit-scorer", "lab choose-scorer", "lab compare-adapters", "lab choose-gate", "lab check-probability", "lab long-queries", "lab layer-sweep", "lab ablation", "lab order-prior", "lab ensemble", "lab heads dump", "lab heads detect",
       "lab heads fit", "lab train blockrank", "lab train query-adapter"}


def _leaves(command, ctx, path: str) -> set[str]:
    """Paths of the leaf commands under ``command`` (``"index kv build"``)."""
    if not hasattr(command, "list_commands"):
        return {path}
    return set().union(*(_leaves(command.get_command(ctx, n), ctx, f"{path} {n}".strip())
                         for n in command.list_commands(ctx)))


def _tree(skip_lab: bool) -> set[str]:
    root = typer.main.get_command(app)
    ctx = typer.Context(root)
    return set().union(*(_leaves(root.get_command(ctx, n), ctx, n) for n in root.list_commands(ctx)
                         if not (skip_lab and n == "lab")))


def test_help_lists_the_product_commands_and_does_not_import_the_lab() -> None:
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom heedrank.cli import app\n"
            "r = CliRunner().invoke(app, ['--help'], terminal_width=200)\nassert r.exit_code == 0, r.output\n"
            "print(sorted(m for m in sys.modules if m.startswith('heedrank.lab.cli')))\nprint(r.output)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded, _, text = out.partition("\n")
    assert loaded == "[]"
    root = typer.main.get_command(app)
    assert set(root.list_commands(typer.Context(root))) == {"index", "eval", "serve", "rerank-batch", "lab"}
    listed = {line.strip(" │").split()[0] for line in text.splitlines() if line.strip(" │")}  # first words (rich or not)
    assert {"index", "eval", "serve", "rerank-batch", "lab"} <= listed
    for research in ("study", "calibrate", "layer-sweep", "ablation", "heads", "train"):
        assert research not in listed
    assert _tree(skip_lab=True) == PRODUCT
    assert "heedrank.lab.cli" not in subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "heedrank", "--help"], capture_output=True, text=True, check=True
    ).stderr


def test_the_lab_holds_the_research_commands() -> None:
    assert _tree(skip_lab=False) == PRODUCT | LAB
    for old in (["eval", "study-fit"], ["eval", "calibrate"], ["heads", "detect"], ["train", "blockrank"]):
        assert CliRunner().invoke(app, [*old, "--help"]).exit_code != 0  # gone from where they were
    text = CliRunner().invoke(app, ["lab", "--help"], terminal_width=200).output
    assert "layer-sweep" in text and "heedrank lab fit" in text  # the lab's own help and examples


def test_a_lab_command_passes_the_error_boundary(tmp_path) -> None:
    res = CliRunner().invoke(app, ["lab", "fit", "--dev", str(tmp_path / "d.npz"), "--test", "t=x.npz",
                                   "--loss", "hinge"])
    assert res.exit_code == 2 and "error (" in res.output and "--loss" in res.output
    res = CliRunner().invoke(app, ["lab", "calibrate", "--card", str(tmp_path / "c.json"), "--calibrate", "c.npz",
                                   "--dev", "d.npz", "--test", "no-equals-sign"])
    assert res.exit_code == 2 and "NAME=DUMP[@MIN_GRADE]" in res.output


def test_command_line_names_the_run() -> None:
    from heedrank.lab.dumps import command_line

    line = command_line("heedrank lab fit", [("--train", [Path("a.npz"), Path("b.npz")]), ("--dev", "d.npz"),
                                             ("--temperature", 1.0), ("--max-layer", None), ("--write", True),
                                             ("--no", False), ("--exclude", [])])
    assert line == "heedrank lab fit --train a.npz --train b.npz --dev d.npz --temperature 1 --write"


def _dump(path: Path, n_queries: int, seed: int) -> Path:
    """A synthetic feature dump (tests/study_items.py): head 1 of layer 2 carries relevance,
    the first stage a weaker signal."""
    from heedrank.lab.study import save_items
    from study_items import study_items

    items, qrels = study_items(n_queries, seed)
    save_items(path, items, {"qrels": qrels, "layer": 3, "max_doc_tokens": 16})
    return path


def test_lab_fit_exports_a_card_and_lab_calibrate_writes_its_cutoff(tmp_path) -> None:
    pytest.importorskip("torch")
    train, dev = _dump(tmp_path / "train.npz", 20, 1), _dump(tmp_path / "dev.npz", 12, 2)
    test, unseen = _dump(tmp_path / "test.npz", 12, 3), _dump(tmp_path / "cal.npz", 40, 4)
    card = tmp_path / "card.json"
    res = CliRunner().invoke(app, ["lab", "fit", "--train", str(train), "--dev", str(dev), "--test", f"t={test}",
                                   "--epochs", "20", "--loss", "pairwise", "--export", str(card)])
    assert res.exit_code == 0, res.output
    assert "| first stage |" in res.output
    data = json.loads(card.read_text())
    assert data["command"] == (f"heedrank lab fit --train {train} --dev {dev} --test t={test} --loss pairwise "
                               f"--temperature 1 --export {card}")
    assert data["fit"] == {"loss": "pairwise", "temperature": 1.0, "layers": None} and len(data["weights"]) == 12
    res = CliRunner().invoke(app, ["lab", "calibrate", "--card", str(card), "--calibrate", str(unseen), "--dev",
                                   str(dev), "--test", f"t={test}", "--counts", "6,12", "--test-counts", "12",
                                   "--write-card", str(tmp_path / "out" / "card.json"), "--out", str(tmp_path / "cal.json")])
    assert res.exit_code == 0, res.output
    assert "calibration: 40 queries (0 excluded), counts [6, 12]" in res.output and "| t (12 q) | none | 12 |" in res.output
    assert "calibration" not in json.loads(card.read_text())  # the card read is never rewritten
    written = json.loads((tmp_path / "out" / "card.json").read_text())["calibration"]
    assert written["command"].startswith(f"heedrank lab calibrate --card {card} --calibrate {unseen} --dev {dev}")
    assert written["command"].endswith(f"--counts 6,12 --test-counts 12 --write-card {tmp_path / 'out' / 'card.json'}")
    in_place = CliRunner().invoke(app, ["lab", "calibrate", "--card", str(card), "--calibrate", str(unseen), "--dev",
                                        str(dev), "--counts", "6,12", "--test-counts", "12", "--write-card", str(card)])
    assert in_place.exit_code == 2 and "in place" in in_place.output
    assert set(written["test"]["t"]) == {"score", "rank", "none"}
    assert json.loads((tmp_path / "cal.json").read_text())["calibration"] == written
    no_train = CliRunner().invoke(app, ["lab", "fit", "--dev", str(dev), "--test", f"t={test}", "--export",
                                        str(tmp_path / "x.json")])
    assert no_train.exit_code == 2 and "--train" in no_train.output


def test_query_adapter_sources_keep_their_own_index(tmp_path, monkeypatch) -> None:
    """A TREC DL source (no index) listed before the dev set does not take the dev set's
    ``--index`` away: every BEIR source reads the index it was given."""
    import heedrank.registry as registry
    import heedrank.lab.train.data as data
    import heedrank.lab.train.query_adapter as query_adapter

    stores: list[tuple[str, object]] = []

    def load_source(spec, *, index=None, **_):
        return [], {}, {}, {}, None if "@" in spec else index

    monkeypatch.setattr(data, "load_source", load_source)
    monkeypatch.setattr(data, "source_store", lambda reranker, index, scratch, name: stores.append((name, index)))
    monkeypatch.setattr(data, "dev_evaluator", lambda *a, **k: None)
    monkeypatch.setattr(query_adapter, "train_query_adapter", lambda *a, **k: {"steps": 0})
    monkeypatch.setattr(registry, "build_reranker", lambda config: object())
    result = CliRunner().invoke(app, ["lab", "train", "query-adapter", "--train", "nf:train", "--train",
                                      "dl21@BM25", "--dev", "nf:dev", "--index", str(tmp_path),
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert stores == [("nf:train", tmp_path), ("dl21@BM25", None), ("nf:dev", tmp_path)]
