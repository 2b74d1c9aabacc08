"""The lab: research and model building, reached only from ``heedrank lab``.

Nothing in the product (``heedrank`` core, ``index``, ``retriever``, ``reranker``, the engines,
``api``, ``eval``) imports this package; the CLI root (:mod:`heedrank.cli.app`) imports
:mod:`heedrank.lab.cli` lazily, the first time ``heedrank lab ...`` is invoked
(``tests/heedrank/test_layering.py`` holds both). The lab builds on the whole product side.

* :mod:`heedrank.lab.cli`: the ``heedrank lab`` commands;
* :mod:`heedrank.lab.train`: everything that fits weights from data (fine-tuning, head fits,
  the relevance cut-off's fit);
* :mod:`heedrank.lab.study`: the cached-BlockRank feature study (feature dumps, design
  matrices, the variants' scores and nDCG@10); :mod:`heedrank.lab.dumps` writes its dumps and
  holds the provenance helpers of the commands;
* :mod:`heedrank.lab.cutoff_eval`: the relevance cut-off evaluated on study dumps;
* :mod:`heedrank.lab.head_study`: ICR attention dumps and the heads ablation;
* :mod:`heedrank.lab.layer_sweep`: the choice of BlockRank's scoring layer;
* :mod:`heedrank.lab.order_prior`: how ``/rerank`` should use the order documents are sent in;
* :mod:`heedrank.lab.candidates`: first-stage candidates of BEIR and TREC DL for the studies.
"""
