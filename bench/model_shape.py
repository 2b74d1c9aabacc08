"""Benchmark: cached BlockRank at a given model shape, with random weights.

What a user bringing another causal LM (``--model DIR``) should expect of the default
reranker's cached path (:mod:`heedrank.reranker.cached`) at that model's shape, without
downloading it: a random-weight model of the shape is built in memory (``transformers``
``LlamaConfig``, ``MistralConfig`` or ``Qwen2Config``, attention implementation
``"heedrank"``), with a small byte-level BPE tokenizer trained here on synthetic words, and
wrapped as a :class:`heedrank.reranker.lm.LoadedLM`. Documents are synthetic text long enough
to fill every block (``--block-tokens`` content tokens, 128 by default).

Measured, each the median over ``--rounds``:

* block encoding: blocks per second of :meth:`CachedBlockRankReranker.encode_block_arrays`
  (layers ``0..l*`` against block 0, float32 arrays on the host, as ``heedrank index kv build``);
* store build: blocks per second encoded and committed to a document KV store in a temporary
  folder (:func:`heedrank.index.kv.build.put_batches`, ``--kv-dtype``);
* warm query: seconds of one rerank at each of ``--candidates`` candidates with every block
  already in the RAM tier (block 0 and the blocks cached; the context assembly, the merged
  query + ``N/A`` pass and the scorer run), and the query pass alone (``timings["query"]``);
* peak memory: the process's peak RSS (MiB; ``ru_maxrss``) and on CUDA the peak allocated GPU
  memory (MiB), with the weights' size.

Random weights give the shape's cost, not a ranking: scores are meaningless. Layers above
``l*`` are built (memory) but never run. Timings on CPU depend on ``--torch-threads``.

    python bench/model_shape.py --layers 30 --hidden 576 --heads 9 --kv-heads 3 --head-dim 64 \\
        --intermediate 1536 --vocab 49152                    # SmolLM2-135M's shape (= --preset smollm2)
    python bench/model_shape.py --preset 7b --device cuda --dtype bfloat16   # Mistral-7B's shape, a GPU
"""

from __future__ import annotations

import argparse
import logging
import random
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("bench.model_shape")

PRESETS: dict[str, dict[str, Any]] = {
    # Mistral-7B-v0.1: 32 layers, hidden 4096, 32 heads / 8 KV heads x 128, MLP 14336, vocab 32000
    "7b": {"arch": "mistral", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
           "intermediate": 14336, "vocab": 32000},
    # SmolLM2-135M (the packaged default LM): 30 layers, hidden 576, 9 heads / 3 KV heads x 64
    "smollm2": {"arch": "llama", "layers": 30, "hidden": 576, "heads": 9, "kv_heads": 3, "head_dim": 64,
                "intermediate": 1536, "vocab": 49152},
}
SHAPE_KEYS = ("arch", "layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab")
CONFIGS = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config"}


@dataclass(frozen=True)
class Shape:
    """A model shape: architecture, layers, hidden size, query heads, KV heads, head dimension,
    MLP size, vocabulary size."""

    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    def describe(self) -> str:
        return (f"{self.arch}, {self.layers} layers, hidden {self.hidden}, {self.heads} heads / {self.kv_heads} KV "
                f"heads x {self.head_dim}, MLP {self.intermediate}, vocab {self.vocab}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="a named shape; explicit shape flags override it")
    ap.add_argument("--arch", choices=sorted(CONFIGS), help="transformers architecture (default llama)")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--head-dim", type=int, help="default hidden / heads")
    ap.add_argument("--intermediate", type=int, help="default 4 x hidden")
    ap.add_argument("--vocab", type=int, help="default 32000")
    ap.add_argument("--layer", type=int, help="l*, the deepest layer run (default round(0.6 x layers), as the reranker)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--block-tokens", type=int, default=128, help="content tokens per block (max_doc_tokens)")
    ap.add_argument("--blocks", type=int, default=64, help="blocks encoded per round (encoding and store build)")
    ap.add_argument("--batch-size", type=int, default=32, help="blocks per batched prefill (doc_batch_size)")
    ap.add_argument("--candidates", default="20,100", help="candidate counts of the warm query passes")
    ap.add_argument("--scoring", choices=("calibrated", "signal", "independent"), default="calibrated",
                    help="scorer of the query passes (calibrated: the merged query + N/A pass; the default "
                         "for a model without a weights card; independent: the query against block 0 and "
                         "logits to the candidates' keys, with random card weights on the text rows)")
    ap.add_argument("--kv-dtype", choices=("int8", "float16"), default="int8", help="store dtype")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--torch-threads", type=int, help="torch CPU threads (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def resolve_shape(args: argparse.Namespace) -> Shape:
    """The shape of ``args``: the preset's values, overridden by explicit flags, then defaults.

    Raises:
        SystemExit: a missing or inconsistent shape (heads not a multiple of KV heads).
    """
    values = dict(PRESETS[args.preset]) if args.preset else {}
    for k in SHAPE_KEYS:
        if getattr(args, k) is not None:
            values[k] = getattr(args, k)
    missing = [k for k in ("layers", "hidden", "heads") if k not in values]
    if missing:
        raise SystemExit(f"give --preset or the shape: missing {', '.join('--' + m.replace('_', '-') for m in missing)}")
    values.setdefault("arch", "llama")
    values.setdefault("kv_heads", values["heads"])
    values.setdefault("head_dim", values["hidden"] // values["heads"])
    values.setdefault("intermediate", 4 * values["hidden"])
    values.setdefault("vocab", 32000)
    shape = Shape(**values)
    if shape.heads % shape.kv_heads:
        raise SystemExit(f"--heads ({shape.heads}) must be a multiple of --kv-heads ({shape.kv_heads})")
    if shape.vocab < 300:
        raise SystemExit("--vocab must be >= 300 (the byte-level tokenizer needs 259 tokens)")
    return shape


def _words(n: int, rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(3, 8))) for _ in range(n)]


def build_tokenizer(vocab: int, words: list[str]) -> Any:
    """A byte-level BPE tokenizer (at most ``min(vocab, 2000)`` tokens) trained on the prompt's
    text and ``words``, with offsets (as a real fast tokenizer)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from heedrank.reranker.doccache import ANSWER, DOC_CLOSE, DOC_OPEN, FINAL, INSTRUCTION

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(vocab, 2000), special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([INSTRUCTION, FINAL, ANSWER, DOC_OPEN, DOC_CLOSE, " ".join(words)] * 4, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>")


def build_lm(shape: Shape, device: str, dtype: str, tokenizer: Any, seed: int) -> Any:
    """A random-weight model of ``shape`` as a :class:`heedrank.reranker.lm.LoadedLM` (eval mode,
    attention ``"heedrank"``, built directly on ``device`` in ``dtype``)."""
    import torch
    import transformers

    from heedrank.reranker.attention import ensure_registered
    from heedrank.reranker.lm import LoadedLM

    ensure_registered()
    kw: dict[str, Any] = {}
    if shape.arch == "mistral":
        kw["sliding_window"] = 4096  # Mistral-7B-v0.1's; past every position of the cached layout
    cfg = getattr(transformers, CONFIGS[shape.arch])(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, max_position_embeddings=4096, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        **kw)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="heedrank",
                                                              dtype=getattr(torch, dtype))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    identity = {"name": f"random-{shape.arch}-{shape.layers}x{shape.hidden}", "source": "random",
                "sha256": f"random-{shape.describe()}"}
    logger.info("built %s on %s in %.1f s", shape.describe(), device, time.perf_counter() - t0)
    return LoadedLM(model, tokenizer, identity, device, time.perf_counter() - t0)


def _peak_rss_mib() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20


def _median_seconds(fn, rounds: int, sync) -> float:
    times = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def random_independent_card(folder: Path, lm: Any, layer: int, block_tokens: int, rng: random.Random) -> Path:
    """A weights card for ``lm`` whose ``independent`` entry has random weights on the query's and
    ``N/A``'s text rows (the groups the packaged card reads), zero elsewhere: the scorer's cost."""
    import json

    from heedrank.reranker.cached.independent import GROUPS
    from heedrank.reranker.doccache import CACHE_TEMPLATE_VERSION

    heads = lm.num_heads
    weights = [rng.gauss(0.0, 0.1) if GROUPS[g] in ("q_text", "na_text") else 0.0
               for _ in range((layer + 1) * heads) for g in range(len(GROUPS))]
    card = {"layer": layer, "max_doc_tokens": block_tokens, "template": CACHE_TEMPLATE_VERSION, "spec": "heads",
            "model_sha256": lm.identity.get("sha256"), "weights": [0.0] * ((layer + 1) * heads),
            "independent": {"layers": layer + 1, "heads": heads, "groups": list(GROUPS), "weights": weights,
                            "bias": -2.0, "fusion_alpha": 0.5, "threshold": 0.5}}
    path = folder / "card.json"
    path.write_text(json.dumps(card))
    return path


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build the model and measure (see the module docstring). Returns the figures:
    ``{"shape", "layer", "weights_mib", "encode_blocks_per_s", "store_blocks_per_s",
    "store_bytes_per_block", "query_s": {n: s}, "query_pass_s": {n: s}, "peak_rss_mib",
    "peak_gpu_mib"}`` (seconds, MiB; ``peak_gpu_mib`` ``None`` on CPU)."""
    import torch

    from heedrank.config import RerankerConfig
    from heedrank.index.kv import KVStore
    from heedrank.index.kv.build import put_batches
    from heedrank.reranker.cached import CachedBlockRankReranker
    from heedrank.types import Document, Query

    shape = resolve_shape(args)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device here")
        torch.cuda.reset_peak_memory_stats()

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    candidates = [int(c) for c in args.candidates.split(",") if c.strip()]
    rng = random.Random(args.seed)
    vocab_words = _words(600, rng)
    # each document fills its block: about 1.5 words per content token, never fewer than the budget
    n_docs = max(args.blocks, max(candidates, default=0))
    docs = [Document(f"d{i}", " ".join(rng.choice(vocab_words) for _ in range(2 * args.block_tokens)))
            for i in range(n_docs)]
    tokenizer = build_tokenizer(shape.vocab, vocab_words)
    lm = build_lm(shape, args.device, args.dtype, tokenizer, args.seed)
    weights_mib = sum(p.numel() * p.element_size() for p in lm.model.parameters()) / 2**20
    layer = args.layer if args.layer is not None else round(0.6 * shape.layers)
    options = {"query_adapter": None, "scoring": args.scoring, "layer": layer, "chat_template": False,
               "doc_batch_size": args.batch_size, "kv_dtype": args.kv_dtype}
    card_dir = tempfile.TemporaryDirectory(prefix="heedrank-bench-card-")
    if args.scoring == "independent":
        options["scorer_weights"] = str(random_independent_card(Path(card_dir.name), lm, layer, args.block_tokens, rng))
    config = RerankerConfig(method="blockrank-cached", max_doc_tokens=args.block_tokens, options=options)
    reranker = CachedBlockRankReranker(config, lm=lm, block_cache_bytes=1 << 50)  # every block stays in RAM
    texts = [d.content for d in docs[: args.blocks]]

    def encode() -> list[Any]:
        out = []
        for b in range(0, len(texts), args.batch_size):
            out += reranker.encode_block_arrays(texts[b : b + args.batch_size])
        return out

    reranker.encode_block_arrays(texts[: min(len(texts), args.batch_size)])  # warm-up: block 0, kernels
    encode_s = _median_seconds(encode, args.rounds, sync)

    header = reranker.block_store_header()
    keys = reranker.block_keys(texts)
    by_key = dict(zip(keys, texts))

    def compute(batch: list[Any]) -> dict[Any, Any]:
        return {k: (kk, vv) for k, kk, vv in reranker.encode_block_arrays([by_key[key] for key in batch])}

    store_times, store_bytes = [], 0.0
    with tempfile.TemporaryDirectory(prefix="heedrank-bench-") as tmp:
        for r in range(args.rounds):
            path = Path(tmp) / f"kv{r}"
            sync()
            t0 = time.perf_counter()
            with KVStore.create(path, header) as store:
                put_batches(store, list(dict.fromkeys(keys)), compute, batch_size=args.batch_size)
            store_times.append(time.perf_counter() - t0)
            store_bytes = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / max(1, len(set(keys)))
    store_s = statistics.median(store_times)

    query_s: dict[int, float] = {}
    pass_s: dict[int, float] = {}
    query = Query("q", " ".join(vocab_words[:6]))
    for n in candidates:
        cands = docs[:n]
        reranker.rerank(query, cands)  # cold: encodes the blocks into the RAM tier
        passes: list[float] = []

        def once() -> None:
            result = reranker.rerank(query, cands)
            assert result.cache == {"hits": n, "misses": 0}, result.cache
            passes.append(float(result.details["timings"].get("query", float("nan"))))

        query_s[n] = _median_seconds(once, args.rounds, sync)
        pass_s[n] = statistics.median(passes)
    return {
        "shape": shape, "layer": layer, "weights_mib": weights_mib,
        "encode_blocks_per_s": len(texts) / encode_s, "store_blocks_per_s": len(set(keys)) / store_s,
        "store_bytes_per_block": store_bytes, "query_s": query_s, "query_pass_s": pass_s,
        "peak_rss_mib": _peak_rss_mib(),
        "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else None,
    }


def table(args: argparse.Namespace, fig: dict[str, Any]) -> str:
    """The figures as a markdown table (one row per metric)."""
    shape: Shape = fig["shape"]
    rows = [
        ("shape", shape.describe()),
        ("device, dtype", f"{args.device}, {args.dtype}" + (f", {args.torch_threads} threads" if args.torch_threads else "")),
        ("l* (layers run)", f"{fig['layer']} ({fig['layer'] + 1})"),
        ("weights (MiB)", f"{fig['weights_mib']:,.0f}"),
        (f"block encoding (blocks/s, {args.block_tokens} tokens)", f"{fig['encode_blocks_per_s']:,.2f}"),
        (f"store build (blocks/s, {args.kv_dtype})", f"{fig['store_blocks_per_s']:,.2f}"),
        ("store bytes per block", f"{fig['store_bytes_per_block']:,.0f}"),
    ]
    for n, s in fig["query_s"].items():
        rows.append((f"warm query, {n} candidates (s; query pass alone)", f"{s:.4f} ({fig['query_pass_s'][n]:.4f})"))
    rows.append(("peak RSS (MiB)", f"{fig['peak_rss_mib']:,.0f}"))
    if fig["peak_gpu_mib"] is not None:
        rows.append(("peak GPU allocated (MiB)", f"{fig['peak_gpu_mib']:,.0f}"))
    lines = [f"\ncached BlockRank, random weights, {args.scoring} scoring, median of {args.rounds} rounds\n",
             "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    fig = run(args)
    print(table(args, fig))
    return fig


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
