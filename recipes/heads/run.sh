#!/usr/bin/env bash
# Rebuild ICR's query-focused head set of SmolLM2-135M-Instruct (reranker/data/
# smollm2-135m-instruct.heads.json: the heads of `--opt heads=qr` and their learned weights of
# `heads=learned`) from ../shared/data. README.md beside this file has the steps and times.
#
#   bash recipes/heads/run.sh            # detect, fit (each skipped once done)
#   bash recipes/heads/run.sh install    # copy out/ over reranker/data/, then review and commit
#
# Settings: RECIPE_WORK (default runs/recipe/heads), RECIPE_DATA (default ../shared/data).
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${RECIPE_WORK:-runs/recipe/heads}
D=${RECIPE_DATA:-../shared/data}
HR=${HEEDRANK:-heedrank}
[ -x .venv/bin/heedrank ] && [ -z "${HEEDRANK:-}" ] && HR=.venv/bin/heedrank
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
OUT=$W/out/smollm2-135m-instruct.heads.json
mkdir -p "$W"/{done,out,logs}

step_detect() {  # 128 seeded NFCorpus train queries, BM25 top 20 shuffled with a relevant one always in; QRScore, top 16
    "$HR" lab heads detect --data "$D/beir-nfcorpus" --split train --queries 128 --candidates 20 --top-k 16 \
        --method qrscore --seed 0 --out "$W/detected.json" --dump "$W/dump"
}

step_fit() {  # per-head weights of the 16 heads, group contrastive loss, on the detection dump
    cp "$W/detected.json" "$W/fitted.json"
    "$HR" lab heads fit --dump "$W/dump" --heads "$W/fitted.json" --max-layer 23 --epochs 200 --lr 0.05 --l2 0.001 \
        --support qr --nonneg
    "$PY" - "$W/fitted.json" "$OUT" <<'PY'
import dataclasses, json, sys
from heedrank.reranker.heads import HeadSet  # the head set's one reader (HeadSet.load)
heads = HeadSet.load(sys.argv[1])
heads = dataclasses.replace(
    heads, model={k: v for k, v in heads.model.items() if k != "path"},  # a path of the machine that ran it
    weights_info={**heads.weights_info, "dump": ("the detection step's dump (128 NFCorpus train queries, BM25 top 20 "
                                                 "shuffled, a relevant one always in)")})
json.dump({**heads.to_json(), "command": "bash recipes/heads/run.sh"}, open(sys.argv[2], "w"), indent=1)
PY
}

step_install() {
    cp "$OUT" reranker/data/
    echo "installed $(basename "$OUT") into reranker/data: review git diff, then commit"
}

run_step() {
    local s=$1 t0
    t0=$(date +%s)
    "step_$s" 2>&1 | tee -a "$W/logs/$s.log"
    printf '%s\t%s\t%s\n' "$s" "$(($(date +%s) - t0))" "$(date -u +%FT%TZ)" >> "$W/steps.tsv"
    touch "$W/done/$s"
}

if [ $# -gt 0 ]; then
    for s in "$@"; do run_step "$s"; done
else
    for s in detect fit; do [ -f "$W/done/$s" ] || run_step "$s"; done
fi
