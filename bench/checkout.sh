#!/usr/bin/env bash
# An import root for another version of the code, for side-by-side benches (bench/search_latency.py --code):
#   bash bench/checkout.sh REV DIR   ->  DIR/heedrank/... laid out as the installed package
# (the repository's top-level folders install as heedrank.api, heedrank.index, ...; see pyproject.toml).
# Run a process on it with PYTHONPATH=DIR from a folder other than this checkout (the current folder comes
# first on sys.path, and this checkout's heedrank/ would shadow DIR's).
set -euo pipefail
REV=$1; DIR=$2
cd "$(dirname "$0")/.."
WT="$DIR/worktree"
rm -rf "$DIR"; mkdir -p "$DIR"
git worktree add --detach -f "$WT" "$REV" >/dev/null
cp -r "$WT/heedrank" "$DIR/heedrank"
for d in api eval index reranker retriever; do ln -sfn "$(cd "$WT/$d" && pwd)" "$DIR/heedrank/$d"; done
echo "$DIR: $(git rev-parse --short "$REV") as an import root"
