"""Helpers of recipes/default/run.sh (and recipes/heads/run.sh): the model's settings, the
calibration queries, the fused card, the artefacts assembled from the recipe's outputs, and
their installation.

Run through ``run.sh``; each subcommand reads and writes only the recipe's work folder (and
``install`` the card folder: ``reranker/data`` for a packaged model, the user card folder
:func:`heedrank.reranker.cards.user_card_dir` for any other, never the package).

The model (``--model``) is a packaged name (``smollm2-135m-instruct``, ``gemma3-270m``) or a
local Hugging Face directory; its artefacts are named ``<model-name>.blockrank-cached.json`` and
``<model-name>.query-adapter`` (:func:`heedrank.reranker.cards.model_card_name`: the
packaged name, or the folder's name plus a short hash of its identity).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "reranker" / "data"
RUN = "bash recipes/default/run.sh"
LAYER_FRACTION = 0.5
"""``l*`` of the recipe as a fraction of the model's depth: ``round(0.5 * L)`` (SmolLM2-135M's 30
layers: 15, the shipped card's)."""
HEADS_MAX_LAYER_FRACTION = 23 / 30
"""The deepest layer weighted by recipes/heads' fit, as a fraction of the depth (SmolLM2: 23)."""
HEADS_TOP_FRACTION = 16 / 270
"""recipes/heads' detected heads as a fraction of the model's ``layers x heads`` (SmolLM2: 16 of 270)."""
TESTS = {"nfcorpus-test-hybrid50": "qa-nf-test-hybrid50", "nfcorpus-test-bm25-20": "qa-nf-test-bm25-20",
         "dl19-bm25-100": "qa-dl19-bm25-100"}


def _read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _write(path: Path, data: Any) -> None:
    from heedrank.files import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(data, indent=1) + "\n").encode())


def _sha256(path: Path) -> str:
    from heedrank.files import file_sha256

    return file_sha256(path)


def model_name(model: str) -> str:
    """The name the artefacts of ``model`` are filed under: a local directory's
    :func:`heedrank.reranker.cards.model_card_name` (its identity hashed), else
    ``model`` itself (a packaged name)."""
    if not Path(model).expanduser().is_dir():
        return model
    from heedrank.reranker.cards import model_card_name
    from heedrank.reranker.lm import model_identity

    return model_card_name(model_identity(str(Path(model).expanduser())))


def install_dir(model: str) -> Path:
    """Where ``install`` writes: ``reranker/data`` for a packaged model, else the user card folder."""
    from heedrank.reranker.lm import packaged_models

    if model in packaged_models():
        return DATA
    from heedrank.reranker.cards import user_card_dir

    return user_card_dir()


def _model_config(model: str) -> dict[str, Any]:
    """The model's ``config.json`` (a packaged GGUF: its converted copy's, converted once into the
    cache), the text model's for a multimodal one."""
    from heedrank.reranker.lm import model_dir

    folder = Path(model).expanduser() if Path(model).expanduser().is_dir() else model_dir(model)
    config = _read(folder / "config.json")
    return config.get("text_config") or config


def model_settings(model: str) -> dict[str, Any]:
    """The recipes' model-dependent settings: ``name`` (:func:`model_name`), ``layers`` and
    ``heads`` (from its config), ``layer`` (``l*`` = ``round(LAYER_FRACTION * layers)``),
    ``heads_max_layer`` and ``heads_top_k`` (recipes/heads, scaled likewise)."""
    config = _model_config(model)
    layers, heads = int(config["num_hidden_layers"]), int(config["num_attention_heads"])
    return {"name": model_name(model), "layers": layers, "heads": heads,
            "layer": min(layers - 1, round(LAYER_FRACTION * layers)),
            "heads_max_layer": min(layers - 1, round(HEADS_MAX_LAYER_FRACTION * layers)),
            "heads_top_k": max(1, round(HEADS_TOP_FRACTION * layers * heads))}


def model_cmd(args: argparse.Namespace) -> None:
    """Print :func:`model_settings` as shell assignments (``MODEL_NAME=...``) for ``eval``."""
    import shlex

    for key, value in model_settings(args.model).items():
        print(f"MODEL_{key.upper()}={shlex.quote(str(value))}")


def calibration_ids(args: argparse.Namespace) -> None:
    """NFCorpus train queries (those with train qrels) not in the ``--exclude`` dump, sorted;
    ``--limit N > 0``: a seeded sample of N of them."""
    from heedrank.data import load_beir_qrels
    from heedrank.lab.dumps import read_query_ids

    seen = read_query_ids([Path(args.exclude)])
    ids = sorted(q for q in load_beir_qrels(args.data, "train") if q not in seen)
    if args.limit > 0 and args.limit < len(ids):
        ids = sorted(random.Random(0).sample(ids, args.limit))
    Path(args.out).write_text("".join(f"{q}\n" for q in ids), encoding="utf-8")
    print(f"{len(ids)} calibration queries ({len(seen)} training queries left out) -> {args.out}")


def web_folds(args: argparse.Namespace) -> None:
    """Split MS MARCO dev-600's train fold for the web-trained query adapter: of its queries
    whose list holds a relevant passage (390), ordered by sha256 of ``"web:<qid>"``, the
    first ``--scorer`` are the scorer's web source (never trained on), the next ``--dev`` the
    adapter's dev queries (its best step; never trained on either), and the rest train it."""
    import hashlib

    from heedrank.eval.sets import load_candidate_set

    cs = load_candidate_set(args.data, "BM25", split="train")
    usable = sorted(q for q in cs.queries
                    if any(cs.qrels.get(q, {}).get(d, 0) > 0 for d in cs.run.get(q, {})))
    usable.sort(key=lambda q: (hashlib.sha256(f"web:{q}".encode()).hexdigest(), q))
    if len(usable) < args.scorer + args.dev + 1:
        sys.exit(f"{args.data}: only {len(usable)} train-fold lists hold a relevant passage")
    folds = {"scorer": usable[: args.scorer], "dev": usable[args.scorer: args.scorer + args.dev],
             "train": usable[args.scorer + args.dev:]}
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, ids in folds.items():
        (out / f"web-{name}-queries.txt").write_text("".join(f"{q}\n" for q in sorted(ids)), encoding="utf-8")
    print(" ".join(f"{name} {len(ids)}" for name, ids in folds.items()) + f" of {len(usable)} -> {out}/web-*-queries.txt")


def _served(fusion: dict[str, Any]) -> dict[str, Any]:
    """The served configuration's figures from the fusion step's report: the dev-chosen
    fusion weight, pure and fused nDCG@10 on dev and each test set, p against the first stage."""
    pure, fused = "default (pure reranker)", "interpolation: first stage + default (fused)"
    chosen = fusion["chosen_on_dev"][fused]
    tests = {name: {"first stage": rows["first stage"]["ndcg@10"], "pure": rows[pure]["ndcg@10"],
                    "pure_p": rows[pure]["p"], "fused": rows[fused]["ndcg@10"], "fused_p": rows[fused]["p"]}
             for name, rows in fusion["tests"].items()}
    return {"alpha": round(float(chosen["alpha"]), 4),
            "dev": {"first stage": fusion["dev"]["first stage"], "pure": fusion["dev"][pure], "fused": chosen["dev"]},
            "tests": tests}


def fused_card(args: argparse.Namespace) -> None:
    """The fitted card with the fusion weight chosen on dev with the adapter (what is served)."""
    card, served = _read(Path(args.card)), _served(_read(Path(args.fusion)))
    card["fusion"] = {"alpha": served["alpha"], "dev_ndcg@10": served["dev"]["fused"],
                      "test_ndcg@10": {t: {"first stage": r["first stage"], "fused": r["fused"], "p": r["fused_p"]}
                                       for t, r in served["tests"].items()}}
    _write(Path(args.out), card)
    print(f"fusion weight {served['alpha']} (dev fused {served['dev']['fused']:.2f}) -> {args.out}")


def _adapter_meta(src: Path, command: str) -> dict[str, Any]:
    """``src/adapter.json`` for packaging: the trainer's machine paths (the model file, the output
    and init folders) replaced by what names them in the recipe, and the step that rebuilds it."""
    meta = _read(src / "adapter.json")
    (meta.get("model") or {}).pop("path", None)  # a path of the machine that trained it
    config = meta.get("config", {})
    config.pop("out_dir", None)
    if config.get("init"):  # a work folder's path: the recipe step that made it
        config["init"] = "the adapter step's adapter (adapter/best of the recipe's work folder)"
    meta["command"] = command
    return meta


def assemble(args: argparse.Namespace) -> None:
    """``out/<model>.blockrank-cached.json`` and ``out/<model>.query-adapter/``: the recipe's
    card (weights, fusion, calibration) and the adapter its scorer was chosen with (``--adapter``,
    tag ``--tag``: the mixed adapter by default; the adapter step's without one), their ``command``
    fields naming the recipe's steps and their inputs recorded by sha256 (the dumps live in the
    work folder). The ``scoring='learned'`` record (``configuration``, ``fusion``, ``calibration``)
    is measured with the adapter step's adapter: with another one packaged, ``configuration``
    names that adapter by sha256 and the learned path serves without its cut-off maps
    (:func:`heedrank.reranker.cached.state._calibration`)."""
    work, model = Path(args.work), model_name(args.model)
    tag = getattr(args, "tag", "qa") or "qa"
    src = Path(args.adapter) if getattr(args, "adapter", None) else work / "adapter" / "best"
    learned_adapter = work / "adapter" / "best"
    latest = [work / "out" / f"card.{c}.json" for c in ("scorer", "independent", "calibrated")]
    card = _read(next(p for p in latest if p.exists()))
    if "scorer" in card:
        _scorer_provenance(card["scorer"])
        card["scorer"]["query_adapter_sha256"] = _sha256(src / "adapter.safetensors")
        card["scorer"]["dumps_sha256"] = {p.stem: _sha256(p) for p in sorted((work / "dumps").glob(f"{tag}-*.npz"))}
    if "independent" in card:
        card["independent"]["command"] = f"{RUN} independent"
        card["independent"]["train"]["dumps"] = [Path(d).stem for d in card["independent"]["train"]["dumps"]]
    served = _served(_read(work / "reports" / "fusion.json"))
    # a seeded work folder (`seed`) lacks the fit's dumps: their hashes come from the card it was seeded from
    dumps = {**(card.get("recipe") or {}).get("dumps_sha256", {}),
             **{p.stem: _sha256(p) for p in sorted((work / "dumps").glob("*.npz"))}}
    train = card.get("train") or {}
    card["train"] = {"dumps": [Path(d).stem for d in train.get("dumps", [])], "queries": train.get("queries")}
    card["command"] = f"{RUN} fit"
    card["dev_ndcg@10"] = {"first stage": served["dev"]["first stage"], "learned": served["dev"]["pure"]}
    card["test_ndcg@10"] = {t: {"first stage": r["first stage"], "learned": r["pure"], "p": r["pure_p"]}
                            for t, r in served["tests"].items()}
    same = src.resolve() == learned_adapter.resolve()
    card["configuration"] = {
        "name": "default", "method": "blockrank-cached", "scoring": "learned",
        "query_adapter": "packaged" if same else
        f"the adapter step's adapter, sha256 {_sha256(learned_adapter / 'adapter.safetensors')}",
        "fusion": served["alpha"],
        "dev_ndcg@10": {"first stage": round(served["dev"]["first stage"], 1), "default": round(served["dev"]["fused"], 1)},
        "test_ndcg@10": {t: {"first stage": round(r["first stage"], 1), "default": round(r["fused"], 1),
                             "p": round(r["fused_p"], 4)} for t, r in served["tests"].items()},
        "note": "this card's weights with the packaged query adapter, fused with the first stage at the weight chosen "
                "on NFCorpus dev (324 queries, hybrid top 50); every test query, paired randomization test against "
                f"the first stage; rebuilt by `{RUN}` (recipes/default/README.md)"}
    calibration = card.get("calibration") or {}
    calibration["command"] = f"{RUN} calibrate"
    card["recipe"] = {"recipe": "recipes/default", "steps": f"{RUN} (recipes/default/README.md)",
                      "model": model, "dumps_sha256": dumps}
    out_card = work / "out" / f"{model}.blockrank-cached.json"
    _write(out_card, card)
    dst = work / "out" / f"{model}.query-adapter"
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copyfile(src / "adapter.safetensors", tmp / "adapter.safetensors")
    meta = _adapter_meta(src, f"{RUN} adapter" if same else f"{RUN} {tag}-adapter")
    if same:
        meta["scorer_weights"] = f"the card {model}.blockrank-cached.json installed beside it (fixed in training)"
        meta["test_ndcg@10"] = served["tests"]
        meta["dev_ndcg@10_nfcorpus_dev_hybrid50"] = {**served["dev"], "fusion_alpha": served["alpha"]}
    else:
        meta["scorer_weights"] = (f"the card {model}.blockrank-cached.json installed beside it: its independent entry "
                                  "fixed in training; its scorer entry (query_adapter_sha256) chosen and measured with it")
    _write(tmp / "adapter.json", meta)
    from heedrank.files import replace_dir

    replace_dir(tmp, dst)
    if same and calibration.get("query_adapter_sha256") not in (None, _sha256(dst / "adapter.safetensors")):
        sys.exit("the calibration was fitted with another adapter than out/'s: rerun the calibrate step")
    print(f"assembled {out_card} and {dst}")


def install(args: argparse.Namespace) -> None:
    """Copy ``out/``'s artefacts into :func:`install_dir` (a packaged model: over the packaged
    ones, review ``git diff``, then commit; another model: the user card folder, where the
    reranker finds them by the model's name and sha256)."""
    work, model = Path(args.work), model_name(args.model)
    card = work / "out" / f"{model}.blockrank-cached.json"
    adapter = work / "out" / f"{model}.query-adapter"
    if not card.is_file() or not (adapter / "adapter.safetensors").is_file():
        sys.exit(f"nothing to install: run the recipe's steps first ({RUN})")
    target = install_dir(args.model)
    (target / adapter.name).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(card, target / card.name)
    for name in ("adapter.json", "adapter.safetensors"):
        shutil.copyfile(adapter / name, target / adapter.name / name)
    if target == DATA:
        print(f"installed into {DATA}: review `git diff --stat reranker/data`, then commit")
    else:
        print(f"installed into the user card folder {target}: `heedrank serve --model {args.model}` serves it")


EVAL_SETS = ("nf-test-hybrid50", "nf-test-bm25-20", "dl19-bm25-100", "dev600-test", "noveleval-web")
"""The ``scorer-eval`` step's test sets (``reports/eval/<set>/<method>/``)."""


def scorer_figures(args: argparse.Namespace) -> None:
    """Write the ``scorer-eval`` step's figures into ``out/card.scorer.json``'s ``scorer`` entry as
    ``test_ndcg@10``: per test set, nDCG@10 x 100 of the first stage alone, the embedder alone
    (``dense``) and the default, and the default's paired randomization p against each
    (:func:`heedrank.eval.compare.compare_reports`, every query)."""
    from heedrank.eval.compare import compare_reports

    work = Path(args.work)
    path = work / "out" / "card.scorer.json"
    card = _read(path)

    def report(name: str, method: str) -> Path:
        found = sorted((work / "reports" / "eval" / name / method).glob("*.json"))
        if not found:
            sys.exit(f"no {method} report for {name}: run `{RUN} scorer-eval`")
        return found[-1]

    figures = {}
    for name in EVAL_SETS:
        row: dict[str, Any] = {}
        for method, label in (("none", "first stage"), ("dense", "dense")):
            c = compare_reports(report(name, method), report(name, "default"))
            d = next(x for x in c.deltas if x.metric.lower() == "ndcg@10")
            row[label], row["default"], row[f"p_vs_{label.replace(' ', '_')}"] = (
                round(100 * d.a, 2), round(100 * d.b, 2), round(d.p_value, 4))
        row["queries"] = len(c.query_ids)
        figures[name] = row
    card["scorer"]["test_ndcg@10"] = figures
    _write(path, card)
    print(json.dumps(figures, indent=1))


TABLE_SETS = (
    ("TREC DL 2019, BM25 top 100", "qa-dl19-bm25-100", 2, "nDCG@10"),
    ("dev-600 test fold, BM25 top 20, MRR@10", "qa-dev600-test-bm25-20", 1, "RR@10"),
    ("dev-600 test fold, BM25 top 20", "qa-dev600-test-bm25-20", 1, "nDCG@10"),
    ("NovelEval, its web order", "qa-noveleval-web-20", 1, "nDCG@10"),
    ("NFCorpus test, BM25 top 20", "qa-nf-test-bm25-20", 1, "nDCG@10"),
    ("NFCorpus test, hybrid top 50", "qa-nf-test-hybrid50", 1, "nDCG@10"),
)
"""The ``scorer-tables`` sets: ``(name, eval-dumps dump, lowest relevant grade, metric)``."""


def scorer_tables(args: argparse.Namespace) -> None:
    """Print one row per test set of the ``eval-dumps`` step's dumps (every query with candidates):
    the first stage alone, the embedder alone, the attention alone, the ``--previous`` card's scorer
    and ``out/card.scorer.json``'s, each served as the product serves it
    (:func:`heedrank.lab.train.source_choice.serve`), with paired randomization p-values
    (:func:`heedrank.eval.compare.randomization_test`)."""
    from heedrank.eval.compare import randomization_test
    from heedrank.lab.train.source_choice import load_source, serve
    from heedrank.scorer import Scorer

    work = Path(args.work)
    new_card, old_card = _read(work / "out" / "card.scorer.json"), _read(Path(args.previous))
    new, old = Scorer.from_card(new_card), Scorer.from_card(old_card)
    assert new is not None and old is not None
    index = Path(args.index) if args.index else None

    def diff(a: Any, b: Any) -> str:
        return f"{a.mean() - b.mean():+.2f} ({randomization_test(list(a - b)):.4f})"

    print("| set | queries | first stage | embedder alone | attention alone | previous default | default | "
          "default - embedder (p) | default - first stage (p) | default - previous (p) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, dump, grade, metric in TABLE_SETS:
        path = work / "dumps" / f"{dump}.npz"
        if not path.is_file():
            print(f"| {name} | no dump ({path.name}: `{RUN} eval-dumps`) |")
            continue
        src = load_source(name, path, grade, metric, new_card, index=index)
        first = src.per_query([it.first_stage for it in src.items])
        dense = src.per_query([v["dense"] for v in src.values])
        attention = src.per_query([v["attention"] for v in src.values])
        now = src.per_query(serve(new, src.values, list(new.features)))
        before = src.per_query(serve(old, src.values, list(old.features)))
        print(f"| {name} | {len(src.items)} | {first.mean():.2f} | {dense.mean():.2f} | {attention.mean():.2f} | "
              f"{before.mean():.2f} | **{now.mean():.2f}** | {diff(now, dense)} | {diff(now, first)} | {diff(now, before)} |")


def _scorer_provenance(entry: dict[str, Any]) -> None:
    """The ``scorer`` entry's command and dumps named by the recipe, not by this machine's paths."""
    entry["command"] = f"{RUN} scorer"
    entry["train"]["dumps"] = [Path(d).stem for d in entry["train"]["dumps"]]
    entry["train"]["split"] = [Path(d).stem for d in entry["train"].get("split", [])]
    if isinstance(entry.get("gate"), dict):  # the query gate: chosen by the same step (lab choose-gate)
        entry["gate"]["command"] = f"{RUN} scorer"


def install_scorer(args: argparse.Namespace) -> None:
    """Copy only the ``scorer`` entry of ``out/card.scorer.json`` into the installed card (the rest
    unchanged): the ``scorer`` step rerun alone, on a seeded folder's dumps."""
    work, model = Path(args.work), model_name(args.model)
    source = work / "out" / "card.scorer.json"
    if not source.is_file():
        sys.exit(f"nothing to install: run `{RUN} scorer` first")
    entry = _read(source)["scorer"]
    _scorer_provenance(entry)
    entry["dumps_sha256"] = {Path(p).stem: _sha256(Path(p)) for p in sorted((work / "dumps").glob("qa-*.npz"))}
    target = install_dir(args.model) / f"{model}.blockrank-cached.json"
    _write(target, {**_read(target), "scorer": entry})
    print(f"installed the scorer entry into {target}: review `git diff`, then commit")


def install_served(args: argparse.Namespace) -> None:
    """Install the ``scorer`` step's scorer with the adapter it was chosen and measured with
    (``--adapter``, its dumps ``<tag>-*.npz``): the scorer entry into the installed card (the rest
    unchanged) and, when it is not the installed one, the adapter over the installed adapter. The
    entry records the adapter's sha256 (``query_adapter_sha256``). A new adapter leaves the card's
    ``scoring='learned'`` record (``configuration``, ``calibration``) measured with the previous
    one: ``configuration.query_adapter`` then names that one by its sha256, and the learned path
    serves without its cut-off maps (they hold only with the adapter they were fitted with,
    :func:`heedrank.reranker.cached.state._calibration`)."""
    work, model, src = Path(args.work), model_name(args.model), Path(args.adapter)
    source = work / "out" / "card.scorer.json"
    if not source.is_file():
        sys.exit(f"nothing to install: run `{RUN} scorer` first")
    if not (src / "adapter.safetensors").is_file():
        sys.exit(f"no adapter in {src}: run its step first")
    target = install_dir(args.model)
    card_path, dst = target / f"{model}.blockrank-cached.json", target / f"{model}.query-adapter"
    card, entry = _read(card_path), _read(source)["scorer"]
    _scorer_provenance(entry)
    sha = _sha256(src / "adapter.safetensors")
    entry["query_adapter_sha256"] = sha
    entry["dumps_sha256"] = {p.stem: _sha256(p) for p in sorted((work / "dumps").glob(f"{args.tag}-*.npz"))}
    previous = _sha256(dst / "adapter.safetensors") if (dst / "adapter.safetensors").is_file() else None
    if previous != sha:
        meta = _adapter_meta(src, f"{RUN} {args.tag}-adapter" if args.tag != "qa" else f"{RUN} adapter")
        meta["scorer_weights"] = (f"the card {card_path.name} installed beside it: its independent entry fixed in "
                                  "training; its scorer entry (query_adapter_sha256) chosen and measured with it")
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / "adapter.safetensors", dst / "adapter.safetensors")
        _write(dst / "adapter.json", meta)
        configuration = card.get("configuration")
        if previous is not None and isinstance(configuration, dict) and configuration.get("query_adapter") == "packaged":
            configuration["query_adapter"] = f"the adapter packaged before, sha256 {previous}"
    _write(card_path, {**card, "scorer": entry})
    print(f"installed the scorer entry into {card_path} and the adapter {src} into {dst}: review `git diff`, then commit")


def install_independent(args: argparse.Namespace) -> None:
    """Copy only the ``independent`` entry of ``out/card.independent.json`` into the packaged card
    (the rest of the card unchanged): the ``independent`` step rerun alone on an earlier run's
    dumps and card."""
    work, model = Path(args.work), model_name(args.model)
    source = work / "out" / "card.independent.json"
    if not source.is_file():
        sys.exit(f"nothing to install: run `{RUN} independent` first")
    entry = _read(source)["independent"]
    entry["command"] = f"{RUN} independent"
    entry["train"]["dumps"] = [Path(d).stem for d in entry["train"]["dumps"]]
    entry["dumps_sha256"] = {Path(p).stem: _sha256(Path(p)) for p in sorted((work / "dumps").glob("qa-*.npz"))}
    target = install_dir(args.model) / f"{model}.blockrank-cached.json"
    _write(target, {**_read(target), "independent": entry})
    print(f"installed the independent entry into {target}: review `git diff`, then commit")


def seed(args: argparse.Namespace) -> None:
    """Seed a work folder from the model's installed card and adapter, so that the steps after
    ``adapter`` (``eval-dumps`` .. ``assemble``) re-measure them, for example on a store of
    another layout, without refitting the weights or retraining the adapter: ``out/card.fit.json``
    (the installed card), ``adapter/best`` (the installed adapter) and ``train-queries.txt``
    (the seeded NFCorpus train queries of the ``dumps`` step, never calibrated on); ``fit`` and
    ``adapter`` are marked done."""
    from heedrank.data import load_beir_qrels, load_beir_queries
    from heedrank.eval.harness import select_queries

    work, model = Path(args.work), model_name(args.model)
    src = install_dir(args.model)
    card, adapter = src / f"{model}.blockrank-cached.json", src / f"{model}.query-adapter"
    if not card.is_file() or not (adapter / "adapter.safetensors").is_file():
        sys.exit(f"no installed card and adapter for {model} in {src}: run the whole recipe ({RUN})")
    (work / "out").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(card, work / "out" / "card.fit.json")
    best = work / "adapter" / "best"
    best.mkdir(parents=True, exist_ok=True)
    for name in ("adapter.json", "adapter.safetensors"):
        shutil.copyfile(adapter / name, best / name)
    selected, _ = select_queries(load_beir_queries(args.data), load_beir_qrels(args.data, "train"), args.train_queries, 0)
    (work / "train-queries.txt").write_text("".join(q.query_id + "\n" for q in selected), encoding="utf-8")
    for step in ("fit", "adapter"):
        (work / "done" / step).parent.mkdir(parents=True, exist_ok=True)
        (work / "done" / step).touch()
    print(f"seeded {work} from {card.name} and {adapter.name} ({len(selected)} train queries excluded)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("model")
    p.add_argument("--model", required=True)
    p = sub.add_parser("calibration-ids")
    p.add_argument("--data", required=True)
    p.add_argument("--exclude", required=True)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--out", required=True)
    p = sub.add_parser("web-folds")
    p.add_argument("--data", required=True, help="MS MARCO dev-600's folder")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--scorer", type=int, default=150)
    p.add_argument("--dev", type=int, default=50)
    p = sub.add_parser("fused-card")
    p.add_argument("--card", required=True)
    p.add_argument("--fusion", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("scorer-figures")
    p.add_argument("--work", required=True)
    p = sub.add_parser("scorer-tables")
    p.add_argument("--work", required=True)
    p.add_argument("--previous", required=True, help="the card whose scorer the new one replaces")
    p.add_argument("--index", help="the NFCorpus index (its stored vectors and BM25)")
    p = sub.add_parser("seed")
    p.add_argument("--work", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--train-queries", type=int, default=400)
    for name in ("assemble", "install", "install-independent", "install-scorer", "install-served"):
        p = sub.add_parser(name)
        p.add_argument("--work", required=True)
        p.add_argument("--model", required=True)
        if name == "install-served":
            p.add_argument("--adapter", required=True, help="the adapter folder the scorer was chosen with")
            p.add_argument("--tag", required=True, help="its dumps' tag (qa, mixed)")
        if name == "assemble":
            p.add_argument("--adapter", help="the adapter folder the scorer was chosen with (default: the adapter "
                                             "step's, WORK/adapter/best)")
            p.add_argument("--tag", default="qa", help="its dumps' tag (qa, mixed)")
    args = parser.parse_args(argv)
    {"model": model_cmd, "calibration-ids": calibration_ids, "web-folds": web_folds, "fused-card": fused_card, "assemble": assemble,
     "install-independent": install_independent, "install-scorer": install_scorer, "install-served": install_served,
     "seed": seed,
     "scorer-figures": scorer_figures, "scorer-tables": scorer_tables,
     "install": install}[args.cmd](args)


if __name__ == "__main__":
    main()
