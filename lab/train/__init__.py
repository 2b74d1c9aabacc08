"""Training: everything in heedrank that fits weights from data, in one package.

What is trained, and where:

* :mod:`heedrank.lab.train.loop`: the one resumable training loop (step counter, seeded
  sampler, RNG state, atomic fsynced checkpoints, an evaluation hook that keeps the best)
  that the two gradient trainers below run through;
* :mod:`heedrank.lab.train.blockrank`: BlockRank fine-tuning of the LM (``L_NTP + lambda *
  L_aux``; ``heedrank lab train blockrank``);
* :mod:`heedrank.lab.train.query_adapter`: the query-side LoRA adapter of cached BlockRank
  (``heedrank lab train query-adapter``); loading and applying a trained adapter is the
  serving side, :mod:`heedrank.reranker.adapters`;
* :mod:`heedrank.lab.train.head_fit`: the head weights of cached BlockRank's learned scorer, fitted
  on feature dumps, the study that chooses them on dev and the weights card (``heedrank lab
  fit``);
* :mod:`heedrank.lab.train.icr_heads`: ICR's query-focused heads, detected and weighted from
  attention dumps (``heedrank lab heads detect|fit``);
* :mod:`heedrank.lab.train.cutoff_fit`: the relevance cut-off's Platt maps, thresholds and fixed
  top-k (``heedrank lab calibrate``); applying them is :mod:`heedrank.calibration`;
* :mod:`heedrank.lab.train.data`: training examples from BEIR splits and TREC DL runs, the KV
  store each source reads, the adapter's dev callback.

The default model's recipe, which of these run, in which order and on which data, is
described in ``recipes/default/README.md`` and run by ``recipes/default/run.sh``. Evaluation
(metrics, dumps and feature extraction, scoring of variants) stays in :mod:`heedrank.eval`;
this package builds on it, and nothing but the CLI imports this package. Heavy libraries
(torch, peft, scikit-learn) are imported inside the functions that use them.
"""
