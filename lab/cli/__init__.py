"""``heedrank lab``: research and model building, apart from the product commands: the
cached-BlockRank feature study (``dump``, ``fit``, ``calibrate``, ``fit-independent``, ``fit-scorer``), the choice of BlockRank's
scoring layer (``layer-sweep``), two models' ensemble (``ensemble``), ICR's query-focused heads (``heads dump|detect|fit``,
``ablation``) and fine-tuning (``train blockrank|query-adapter``).

:mod:`heedrank.cli.app` registers this group lazily (as ``vllm bench`` is): these modules
are imported only when ``heedrank lab ...`` is invoked, never by ``heedrank --help`` or a
product command. The work is in :mod:`heedrank.lab` (dumps, evaluation:
:mod:`heedrank.lab.dumps`, :mod:`heedrank.lab.study`, :mod:`heedrank.lab.head_study`,
:mod:`heedrank.lab.layer_sweep`) and :mod:`heedrank.lab.train` (fits and fine-tuning:
:mod:`heedrank.lab.train.head_fit`, :mod:`heedrank.lab.train.cutoff_fit`,
:mod:`heedrank.lab.train.icr_heads`, :mod:`heedrank.lab.train.blockrank`,
:mod:`heedrank.lab.train.query_adapter`); the commands print or write their records.
"""

from __future__ import annotations

import typer

from heedrank.lab.cli import ensemble, heads, independent, prior, scorer, study, sweep, train

app = typer.Typer(help="Research and model building, apart from the product commands: the cached-BlockRank "
                  "feature study (dump, fit, calibrate), BlockRank's scoring layer (layer-sweep), ICR's "
                  "query-focused heads (heads, ablation) and fine-tuning (train).",
                  epilog=study.EXAMPLES, no_args_is_help=True)
app.command("dump")(study.lab_dump)
app.command("fit")(study.lab_fit)
app.command("calibrate")(study.lab_calibrate)
app.command("fit-independent")(independent.lab_fit_independent)
app.command("fit-scorer")(scorer.lab_fit_scorer)
app.command("choose-scorer")(scorer.lab_choose_scorer)
app.command("compare-adapters")(scorer.lab_compare_adapters)
app.command("choose-gate")(scorer.lab_choose_gate)
app.command("check-probability")(scorer.lab_check_probability)
app.command("long-queries")(study.lab_long_queries)
app.command("layer-sweep")(sweep.lab_layer_sweep)
app.command("ablation")(heads.lab_ablation)
app.command("order-prior")(prior.lab_order_prior)
app.command("ensemble")(ensemble.lab_ensemble)
app.add_typer(heads.app, name="heads")
app.add_typer(train.app, name="train")
