#!/usr/bin/env bash
# Rebuild ICR's query-focused head set of a model (the packaged one: reranker/data/
# smollm2-135m-instruct.heads.json: the heads of `--opt heads=qr` and their learned weights of
# `heads=learned`) from ../shared/data. README.md beside this file has the steps and times.
#
#   bash recipes/heads/run.sh            # detect, fit (each skipped once done)
#   bash recipes/heads/run.sh install    # copy out/ over reranker/data/ (a packaged model; then review
#                                        # and commit), or into the user card folder (any other model)
#
# Settings: RECIPE_MODEL (a packaged name or a local Hugging Face directory; default
# smollm2-135m-instruct), RECIPE_DEVICE (default cpu), RECIPE_TOP_K (heads kept; default
# round(16/270 of layers x heads): 16 for SmolLM2), RECIPE_MAX_LAYER (deepest layer weighted;
# default round(23/30 L): 23 for SmolLM2), RECIPE_WORK (default runs/recipe/heads-<model-name>),
# RECIPE_DATA (default ../shared/data).
set -euo pipefail
cd "$(dirname "$0")/../.."
HR=${HEEDRANK:-heedrank}
[ -x .venv/bin/heedrank ] && [ -z "${HEEDRANK:-}" ] && HR=.venv/bin/heedrank
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
M=${RECIPE_MODEL:-smollm2-135m-instruct}
DEV=${RECIPE_DEVICE:-cpu}
SETTINGS=$("$PY" recipes/default/steps.py model --model "$M")   # from the model's config, nothing assumed
eval "$SETTINGS"   # MODEL_NAME, MODEL_LAYERS, MODEL_HEADS, MODEL_HEADS_MAX_LAYER, MODEL_HEADS_TOP_K
TOP_K=${RECIPE_TOP_K:-$MODEL_HEADS_TOP_K}
MAX_LAYER=${RECIPE_MAX_LAYER:-$MODEL_HEADS_MAX_LAYER}
W=${RECIPE_WORK:-runs/recipe/heads-$MODEL_NAME}
D=${RECIPE_DATA:-../shared/data}
OUT=$W/out/$MODEL_NAME.heads.json
mkdir -p "$W"/{done,out,logs}

step_detect() {  # 128 seeded NFCorpus train queries, BM25 top 20 shuffled with a relevant one always in; QRScore, top $TOP_K
    "$HR" lab heads detect --data "$D/beir-nfcorpus" --split train --queries 128 --candidates 20 --top-k "$TOP_K" \
        --method qrscore --seed 0 --out "$W/detected.json" --dump "$W/dump" --model "$M" --device "$DEV"
}

step_fit() {  # per-head weights of the detected heads, group contrastive loss, on the detection dump (no LM)
    cp "$W/detected.json" "$W/fitted.json"
    "$HR" lab heads fit --dump "$W/dump" --heads "$W/fitted.json" --max-layer "$MAX_LAYER" --epochs 200 --lr 0.05 --l2 0.001 \
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

step_install() {  # reranker/data for a packaged model, else the user card folder (resolve_heads looks there)
    local dest
    dest=$("$PY" -c 'import sys; sys.path.insert(0, "recipes/default"); import steps; print(steps.install_dir(sys.argv[1]))' "$M")
    mkdir -p "$dest"
    cp "$OUT" "$dest/"
    echo "installed $(basename "$OUT") into $dest (a packaged model: review git diff, then commit)"
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
