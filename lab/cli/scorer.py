"""``heedrank lab fit-scorer``: the default's scorer over every signal (:mod:`heedrank.scorer`;
the fit: :mod:`heedrank.lab.train.scorer_fit`), written as the ``scorer`` entry of a new weights card."""

from __future__ import annotations

import json
from dataclasses import replace
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from heedrank.lab.train.source_choice import Source


def read_source(name: str, spec: str, card: Mapping[str, Any], index: Path | None) -> Source:
    """One ``NAME=DUMP[@MIN_GRADE][:METRIC]`` source of the scorer's lab commands, loaded
    (:func:`heedrank.lab.train.source_choice.load_source`; grade 1 and nDCG@10 unless given)."""
    from heedrank.lab.train.source_choice import load_source

    path, _, metric = spec.partition(":")
    dump, _, grade = path.partition("@")
    return load_source(name, Path(dump), int(grade or 1), metric or "nDCG@10", card, index=index)


def lab_fit_scorer(
    train: Annotated[list[str], typer.Option("--train", help="DUMP[@MIN_GRADE]: training feature dumps of the served "
                                             "reranker (heedrank lab dump --adapter; repeatable; MIN_GRADE the lowest "
                                             "relevant grade, default 1, 2 for TREC DL).")],
    dev: Annotated[Path, typer.Option("--dev", help="Dev dump: C (with --split's held-out halves) and the cut-off "
                                      "are chosen on it.")],
    card: Annotated[Path, typer.Option("--card", help="Weights card with the 'independent' entry (read only): the "
                                       "attention signal is its log-odds.")],
    test: Annotated[Optional[list[str]], typer.Option(
        "--test", help="NAME=DUMP[@MIN_GRADE] test sets (repeatable; MIN_GRADE 2 for TREC DL).")] = None,
    split: Annotated[Optional[list[str]], typer.Option(
        "--split", help="DUMP[@MIN_GRADE]: a training source of which half the queries are held out, C chosen on "
                        "the mean of dev and these halves (repeatable; TREC DL 2021: @2).")] = None,
    index: Annotated[Optional[Path], typer.Option(
        "--index", help="The index the BEIR dumps were made with: their dense cosines are read from its stored "
                        "vectors (else every text is encoded by the packaged embedder).")] = None,
    write_card: Annotated[Optional[Path], typer.Option(
        "--write-card", help="Write --card with the 'scorer' entry to this NEW path.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the entry and report (JSON) here.")] = None,
) -> None:
    """Fit the default's scorer (one logistic model per subset of the signals attention, dense
    and rank; C and the cut-off chosen on dev) and report nDCG@10 of every signal and model, ROC AUC
    and calibration error on dev and each test set."""
    from heedrank.lab.cli.study import write_new_card
    from heedrank.lab.dumps import command_line, graded, graded_sets
    from heedrank.lab.train.scorer_fit import fit_scorer, format_fit
    from heedrank.reranker.cards import read_card

    sources, tests = graded_sets(train, test or [])
    halves = [graded(spec) for spec in split or []]
    data = read_card(card).data
    entry = fit_scorer(sources, dev, tests, card=data, index=index, split=halves)
    entry["command"] = command_line("heedrank lab fit-scorer", [
        ("--train", train), ("--split", split), ("--dev", dev), ("--card", card), ("--test", test), ("--index", index),
        ("--write-card", write_card)])
    if out is not None:
        out.write_text(json.dumps(entry, indent=1))
    if write_card is not None:
        write_new_card(write_card, {**data, "scorer": entry}, source=card)
    typer.echo(format_fit(entry))


def lab_choose_scorer(
    source: Annotated[list[str], typer.Option("--source", help="NAME=DUMP[@MIN_GRADE][:METRIC]: a training source "
                                              "(repeatable; METRIC nDCG@10, the default, or RR@10 for MS MARCO "
                                              "dev-600; MIN_GRADE 2 for TREC DL).")],
    card: Annotated[Path, typer.Option("--card", help="Weights card with the 'independent' entry (read only).")],
    index: Annotated[Optional[Path], typer.Option("--index", help="The index the BEIR dumps were made with.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the report (JSON) here.")] = None,
    dev: Annotated[Optional[Path], typer.Option("--dev", help="Dev dump (NFCorpus dev): the cut-off of the "
                                                "written entry is chosen on it.")] = None,
    write_card: Annotated[Optional[Path], typer.Option(
        "--write-card", help="Write --card with the 'scorer' entry of the 'direction' configuration, fitted on "
                             "every source, to this NEW path.")] = None,
    rank_only: Annotated[Optional[list[str]], typer.Option(
        "--rank-only", help="NAME of a source that chooses the scorer's direction but not its probability (its "
                            "qrels mark one passage a query, the rest unjudged: MS MARCO dev-600; repeatable).")] = None,
) -> None:
    """Choose the default's scorer by leave-one-source-out (heedrank.lab.train.source_choice): hold
    each source out, fit every configuration on the others, and print each one's held-out value and
    margin over the source's best single signal (first stage or embedder alone)."""
    from heedrank.lab.cli.study import write_new_card
    from heedrank.lab.dumps import command_line, parse_named
    from heedrank.lab.train.source_choice import choose, format_choice, load_source, scorer_entry
    from heedrank.reranker.cards import read_card

    data = read_card(card).data
    sources, dumps = [], []
    for name, spec in parse_named(source, "--source", "NAME=DUMP[@MIN_GRADE][:METRIC]").items():
        dumps.append(Path(spec.partition(":")[0].partition("@")[0]))
        loaded = read_source(name, spec, data, index)
        sources.append(replace(loaded, calibrates=name not in set(rank_only or [])))
    unknown = set(rank_only or []) - {s.name for s in sources}
    if unknown:
        raise typer.BadParameter(f"no source named {sorted(unknown)}; sources: {[s.name for s in sources]}",
                                 param_hint="--rank-only")
    report = choose(sources)
    command = command_line("heedrank lab choose-scorer", [("--source", source), ("--rank-only", rank_only),
                                                          ("--card", card), ("--index", index), ("--dev", dev),
                                                          ("--write-card", write_card)])
    report["command"] = command
    if out is not None:
        out.write_text(json.dumps(report, indent=1))
    typer.echo(format_choice(report))
    if write_card is not None:
        held = load_source("dev", dev, 1, "nDCG@10", data, index=index) if dev is not None else None
        entry = scorer_entry(sources, dumps, held, report)
        entry["command"] = command
        write_new_card(write_card, {**data, "scorer": entry}, source=card)
        typer.echo(f"scorer entry ({len(entry['models'])} models, cut-off {entry['threshold']}) -> {write_card}")


def lab_compare_adapters(
    dumps: Annotated[Path, typer.Option("--dumps", help="Folder of the dumps, named ADAPTER-SET.npz (the recipe's "
                                        "dumps/ folder: qa-dl19-bm25-100.npz, web-independent-dl19-bm25-100.npz).")],
    card: Annotated[Path, typer.Option("--card", help="Weights card with the 'independent' entry (read only).")],
    fit: Annotated[list[str], typer.Option("--fit", help="SET[@MIN_GRADE][:METRIC]: a source the scorers are fitted "
                                           "on (repeatable), e.g. dev600-scorer-bm25-20:RR@10.")],
    test: Annotated[list[str], typer.Option("--test", help="SET[@MIN_GRADE][:METRIC]: a test set (repeatable), "
                                            "e.g. dl19-bm25-100@2.")],
    adapters: Annotated[str, typer.Option("--adapters", help="The two adapters' prefixes, the reference first.")
                        ] = "qa,web-independent",
    index: Annotated[Optional[Path], typer.Option("--index", help="The index the BEIR dumps were made with.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the report (JSON) here.")] = None,
) -> None:
    """Two query adapters side by side on the same queries, paired (heedrank.lab.train.adapter_compare):
    the single signals, and scorers fitted on --fit and read on each --test set."""
    from heedrank.lab.train.adapter_compare import compare_adapters, format_comparison
    from heedrank.lab.train.source_choice import load_source
    from heedrank.reranker.cards import read_card

    data = read_card(card).data

    def sets(specs: list[str], adapter: str) -> list[Source]:
        out_ = []
        for spec in specs:
            path, _, metric = spec.partition(":")
            name, _, grade = path.partition("@")
            dump = dumps / f"{adapter}-{name}.npz"
            if not dump.is_file():
                raise typer.BadParameter(f"no dump {dump} (heedrank lab dump --adapter ... --out {dump})")
            out_.append(load_source(name + (f":{metric}" if metric else ""), dump, int(grade or 1),
                                    metric or "nDCG@10", data, index=index))
        return out_

    names = [a.strip() for a in adapters.split(",") if a.strip()]
    if len(names) != 2:
        raise typer.BadParameter("two adapters, comma-separated", param_hint="--adapters")
    report = compare_adapters({a: (sets(fit, a), sets(test, a)) for a in names})
    if out is not None:
        out.write_text(json.dumps(report, indent=1))
    typer.echo(format_comparison(report))


def lab_choose_gate(
    source: Annotated[list[str], typer.Option("--source", help="NAME=DUMP[@MIN_GRADE][:METRIC]: a source the card's "
                                              "scorer was fitted on (repeatable; as lab choose-scorer's).")],
    long: Annotated[str, typer.Option("--long", help="NAME=DUMP[@MIN_GRADE][:METRIC]: the long-query source "
                                      "(heedrank lab long-queries, then lab dump).")],
    card: Annotated[Path, typer.Option("--card", help="Weights card with the 'scorer' entry (read only).")],
    index: Annotated[Optional[Path], typer.Option("--index", help="The index the BEIR dumps were made with.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the report (JSON) here.")] = None,
    write_card: Annotated[Optional[Path], typer.Option(
        "--write-card", help="Write --card with the chosen gate in its 'scorer' entry to this NEW path.")] = None,
) -> None:
    """Choose the scorer's query gate on a source of long queries (heedrank.lab.train.gate_choice):
    up to the scorer's sources' longest query the score is the scorer's own, past it it leans on a
    target model (the embedder alone); the target and power are chosen on the long source, paired with
    the embedder alone and the ungated scorer."""
    from heedrank.lab.cli.study import write_new_card
    from heedrank.lab.dumps import command_line, parse_named
    from heedrank.lab.train.gate_choice import choose_gate, format_gate, gate_entry
    from heedrank.reranker.cards import read_card
    from heedrank.scorer import Scorer

    data = read_card(card).data
    scorer = Scorer.from_card(data)
    if scorer is None:
        raise typer.BadParameter(f"{card} has no 'scorer' entry: fit one first (heedrank lab choose-scorer)",
                                 param_hint="--card")

    sources = [read_source(n, s, data, index)
               for n, s in parse_named(source, "--source", "NAME=DUMP[@MIN_GRADE][:METRIC]").items()]
    (long_name, long_spec), = parse_named([long], "--long", "NAME=DUMP[@MIN_GRADE][:METRIC]").items()
    report = choose_gate(scorer, sources, read_source(long_name, long_spec, data, index))
    command = command_line("heedrank lab choose-gate", [("--source", source), ("--long", long), ("--card", card),
                                                        ("--index", index), ("--write-card", write_card)])
    report["command"] = command
    if out is not None:
        out.write_text(json.dumps(report, indent=1, default=str))
    typer.echo(format_gate(report))
    if write_card is not None:
        entry = gate_entry(report)
        scorer_data = {k: v for k, v in data["scorer"].items() if k != "gate"}
        if entry is not None:
            scorer_data["gate"] = {**entry, "command": command}
        write_new_card(write_card, {**data, "scorer": scorer_data}, source=card)
        typer.echo(f"scorer gate {entry and {k: entry[k] for k in ('limit', 'power')}} -> {write_card}")


def lab_check_probability(
    card: Annotated[list[str], typer.Option("--card", help="NAME=CARD: a weights card with a 'scorer' entry "
                                             "(repeatable; read only).")],
    test: Annotated[list[str], typer.Option("--test", help="NAME=DUMP[@MIN_GRADE]: a feature dump of the served "
                                            "reranker (repeatable; MIN_GRADE 2 for TREC DL).")],
    index: Annotated[Optional[Path], typer.Option("--index", help="The index the BEIR dumps were made with.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the report (JSON) here.")] = None,
) -> None:
    """Does the scorer's probability mean what it says (heedrank.lab.train.probability_check)? Per set and
    card, as /rerank and /search serve it: the relevant share against the mean probability, the top
    candidate's probability against how often it is relevant, the calibration error, and /rerank's
    reliability (each bin of probability's relevant share against its mean probability)."""
    from heedrank.lab.dumps import parse_named
    from heedrank.lab.train.probability_check import check, format_check
    from heedrank.reranker.cards import read_card
    from heedrank.scorer import Scorer

    cards = {n: read_card(Path(p)).data for n, p in parse_named(card, "--card", "NAME=CARD").items()}
    scorers = {}
    for name, data in cards.items():
        scorer = Scorer.from_card(data)
        if scorer is None:
            raise typer.BadParameter(f"card {name!r} has no 'scorer' entry", param_hint="--card")
        scorers[name] = scorer
    first = next(iter(cards.values()))
    sources = [read_source(name, spec, first, index)
               for name, spec in parse_named(test, "--test", "NAME=DUMP[@MIN_GRADE]").items()]
    report = check(scorers, sources)
    if out is not None:
        out.write_text(json.dumps(report, indent=1))
    typer.echo(format_check(report))
