#!/usr/bin/env bash
# Set everything up and run the default test suite (slow tests: add `-m slow`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
