#!/usr/bin/env bash
# Set everything up and run the default test suite (slow tests: add `-m slow`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Docstrings point into this repository (docs/results/*.md headings, papers), never to issues or to
# design notes outside it.
if git grep -nE "issue[ -]?#[0-9]|shared/design" -- '*.py' 2>/dev/null; then
    echo "scripts/test.sh: the lines above cite an issue number or ../shared/design: cite a docs/results/*.md heading or the paper" >&2
    exit 1
fi
exec .venv/bin/python -m pytest "$@"
