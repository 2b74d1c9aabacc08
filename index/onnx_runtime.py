"""The embedder on ONNX Runtime: the same sentence-transformers pipeline (tokenizer,
length-sorted batches, mean pooling, L2 normalisation), with only the transformer's forward pass
run by ``onnxruntime``'s fused BERT graph instead of PyTorch, in float32: the vectors equal
PyTorch's (cosine 1.0000 to four places), so indexes built either way are interchangeable;
batches encode 4-18% faster on 2 AVX2 cores and a single query 2-4x faster
(``bench/embed_speed.py``; ``docs/results/scale.md``).

Why not sentence-transformers' own ``backend="onnx"``: it loads through ``optimum-onnx``, whose
releases pin ``transformers<5`` (this project runs 5.x), and ``optimum-intel`` (OpenVINO) pulls a
CUDA build of torch. So the model is converted here once, with the libraries' own tools, and cached
under ``$HEEDRANK_CACHE_DIR/models`` keyed by the weights' sha256 (about 10 s, once):

1. ``torch.onnx.export`` of the Hugging Face encoder with eager attention (so that step 2 can
   recognise the attention pattern), opset 17, dynamic batch and sequence axes;
2. ``onnxruntime.transformers.optimizer.optimize_model`` (``model_type="bert"``): fused attention,
   GELU, skip and embedding layer norms.

int8 weights (``onnxruntime.quantization.quantize_dynamic`` of that graph) were measured and not
kept: on CPUs without VNNI they add 3-12% over the fused float32 graph while moving the vectors
(median cosine 0.994 to float32; ``bench/embed_speed.py`` measures both). An index records the
runtime that built it (``params.json`` ``dense.embedder.runtime``) and encodes its queries with
the same one. Only BERT-family encoders (``config.model_type`` in :data:`FUSABLE`) are converted;
others run on PyTorch, as does an ``auto`` encoder whose conversion fails (with a warning).

A third runtime, :data:`BF16`, is PyTorch with float32 weights under ``torch.autocast`` to
bfloat16: on a CPU with AMX (Intel Sapphire Rapids and later) it encodes 2.6x faster than float32
PyTorch and 3x faster than the fused graph (194 passages/s against 65 on 2 cores), with vectors
at cosine 1.0000 to float32's (``bench/embed_speed.py``; ``docs/results/scale.md``). It is opt-in
(``--embedder-runtime bf16``); asked for on a CPU without native bfloat16 (no ``amx_bf16`` or
``avx512_bf16`` flag), where autocast would emulate it slowly, it resolves as ``auto`` does, with
a warning: the vectors agree to bfloat16 rounding, so such an index still serves.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from heedrank.errors import ModelLoadError, ValidationError, require
from heedrank.files import cache_dir

logger = logging.getLogger(__name__)

TORCH = "torch"
ONNX = "onnx"
BF16 = "bf16"
AUTO = "auto"
RUNTIMES = (AUTO, TORCH, ONNX, BF16)
"""``runtime`` values: ``auto`` = :data:`ONNX` for a BERT-family model when ``onnxruntime`` is
installed, else :data:`TORCH` (PyTorch); :data:`BF16` = PyTorch under bfloat16 autocast, where
the CPU has native bfloat16 (module docstring)."""
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""``/proc/cpuinfo`` flags of a CPU that runs bfloat16 matrix products natively."""
FUSABLE = ("bert",)
"""``config.model_type`` values whose graph ``optimize_model`` fuses (all-MiniLM-L6-v2 is one)."""
RECIPE = "v1"
"""Version of the conversion above, part of the cached file's name: a change re-exports."""
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def resolve_runtime(runtime: str, model_type: str) -> str:
    """The runtime ``runtime`` names for a model of ``model_type``: ``auto`` resolved (module
    docstring); ``onnx`` where ``onnxruntime`` is not installed falls back to ``torch`` with a
    warning (the vectors are the same). Raises ValidationError: an unknown name, or ``onnx`` for a
    model this module cannot convert."""
    if runtime not in RUNTIMES:
        raise ValidationError(f"unknown embedder runtime {runtime!r}; choose one of {list(RUNTIMES)}")
    if runtime == TORCH:
        return TORCH
    if runtime == BF16:
        if cpu_has_bf16():
            return BF16
        logger.warning("embedder runtime %r asked for on a CPU without native bfloat16 (no %s flag): "
                       "encoding as 'auto' does (vectors agree to bfloat16 rounding)", BF16, " or ".join(BF16_FLAGS))
        runtime = AUTO
    fusable = model_type in FUSABLE
    if runtime == ONNX and not fusable:
        raise ValidationError(f"embedder runtime {ONNX!r} converts BERT-family models only, not "
                              f"{model_type!r}; use --embedder-runtime torch")
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        if runtime == ONNX:  # an index built on ONNX Runtime, opened where it is not installed
            logger.warning("onnxruntime is not installed: the embedder runs on torch (the same vectors, "
                           "slower); `pip install onnxruntime` to use it")
        return TORCH
    return ONNX if fusable else TORCH


def cpu_has_bf16(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> bool:
    """True where the CPU's flags (Linux ``/proc/cpuinfo``) name native bfloat16 matrix products
    (:data:`BF16_FLAGS`); False where the file is missing (other systems) or names none."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return False
    flags = {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[-1].split()}
    return any(f in flags for f in BF16_FLAGS)


def onnx_model(model_dir: Path, sha256: str, *, cache: str | os.PathLike[str] | None = None) -> Path:
    """The fused ONNX file of the model in ``model_dir`` (weights hash ``sha256``), converted on
    first use (about 10 s for all-MiniLM-L6-v2) and cached; a half-written file is never read
    (written beside, then renamed).

    Raises:
        ModelLoadError: the export or the graph fusion failed.
    """
    target = cache_dir(cache) / "models" / f"{model_dir.name}-{sha256[:16]}-onnx-{RECIPE}.onnx"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    torch = require("torch", "index")
    transformers = require("transformers", "index")
    require("onnxruntime", "index")
    from onnxruntime.transformers.optimizer import optimize_model

    logger.info("converting embedder %s to ONNX (once): %s", model_dir, target)
    try:
        model = transformers.AutoModel.from_pretrained(str(model_dir), attn_implementation="eager",
                                                       local_files_only=True).eval()
        cfg = model.config
        example = {n: torch.ones((2, 8), dtype=torch.long) for n in INPUTS}
        example["token_type_ids"] = torch.zeros((2, 8), dtype=torch.long)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            exported, fused = Path(tmp) / "model.onnx", Path(tmp) / "fused.onnx"
            axes = {n: {0: "batch", 1: "tokens"} for n in (*INPUTS, "last_hidden_state")}
            with torch.no_grad(), warnings.catch_warnings():
                # the tracer's notes on shapes it fixes (the mask's padding, which a tokenizer's
                # mask never needs) and on index ops with negative indices (none here); the oracle
                # test checks the vectors
                warnings.simplefilter("ignore")
                torch.onnx.export(_last_hidden(model), tuple(example[n] for n in INPUTS), str(exported),
                                  input_names=list(INPUTS), output_names=["last_hidden_state"],
                                  dynamic_axes=axes, opset_version=17, dynamo=False)
            optimize_model(str(exported), model_type="bert", num_heads=cfg.num_attention_heads,
                           hidden_size=cfg.hidden_size).save_model_to_file(str(fused))
            os.replace(fused, target)
    except Exception as exc:  # noqa: BLE001 - any failure of the converters leaves the model unusable here
        raise ModelLoadError(f"could not convert embedder {model_dir} to ONNX: {exc}; "
                             f"build with --embedder-runtime torch") from exc
    return target


def _last_hidden(model: Any) -> Any:
    """``model(**inputs).last_hidden_state`` as a module of positional inputs, for ``torch.onnx.export``."""
    import torch

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    return LastHidden()


def run_on_onnx(st_model: Any, path: Path, *, threads: int | None = None) -> None:
    """Make the loaded ``SentenceTransformer`` ``st_model`` run its transformer's forward pass on
    the ONNX file ``path`` (in place: its first module's Hugging Face model is replaced by an
    ``onnxruntime`` session; tokenisation, pooling and normalisation stay sentence-transformers').

    Args:
        threads: ONNX Runtime intra-op threads; ``None`` = torch's thread count.
    """
    import numpy as np
    import torch

    ort = require("onnxruntime", "index")
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(threads or torch.get_num_threads())
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    hf = st_model[0].model

    class OnnxForward(torch.nn.Module):
        """Stands in for the Hugging Face model: takes its keyword inputs, returns
        ``{"last_hidden_state": float32 (batch, tokens, hidden)}``."""

        def __init__(self) -> None:
            super().__init__()
            self.config = hf.config

        def forward(self, input_ids: Any = None, attention_mask: Any = None, token_type_ids: Any = None,
                    **_: Any) -> dict[str, Any]:
            given = {"input_ids": input_ids, "attention_mask": attention_mask,
                     "token_type_ids": token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)}
            feeds = {n: given[n].cpu().numpy().astype(np.int64, copy=False) for n in names}
            return {"last_hidden_state": torch.from_numpy(session.run(None, feeds)[0])}

    st_model[0].model = OnnxForward()
