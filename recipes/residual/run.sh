#!/usr/bin/env bash
# Residual training of the query adapter (docs/RESULTS.md, "Residual training of the query
# adapter"): the recipe's adapter step (recipes/default/run.sh adapter) with the served fusion
# inside the loss (`--fusion 0.5`, the card's weight; best step by dev's fused nDCG@10), then
# dumps of it and of the packaged adapter, and the served comparison.
#
#   bash recipes/residual/run.sh             # every step not done yet
#   bash recipes/residual/run.sh compare     # one step (again)
#
# Resumable as recipes/default/run.sh is. Settings: RECIPE_WORK (default runs/recipe/residual),
# RECIPE_INDEX (an NFCorpus index with its store, default indexes/nfcorpus), RECIPE_DATA.
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${RECIPE_WORK:-runs/recipe/residual}
D=${RECIPE_DATA:-../shared/data}
IDX=${RECIPE_INDEX:-indexes/nfcorpus}
HR=heedrank; [ -x .venv/bin/heedrank ] && HR=.venv/bin/heedrank
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
NF=$D/beir-nfcorpus
PACKAGED=reranker/data/smollm2-135m-instruct.query-adapter
mkdir -p "$W"/{done,dumps,kv,reports,logs}
STEPS=(train dumps compare)

step_train() {
    "$HR" lab train query-adapter --train "$NF:train" --train-queries 400 --dev "$NF:dev" --dev-queries 60 \
        --index "$IDX" --out "$W/residual" --steps 600 --batch-queries 2 --eval-every 50 --lr 3e-4 --fusion 0.5 \
        > "$W/reports/residual.json"
}

step_dumps() {
    for a in packaged residual; do
        local dir=$PACKAGED; [ "$a" = packaged ] || dir=$W/$a/best
        "$HR" lab dump --data "$NF" --split dev --retriever hybrid --candidates 50 --index "$IDX" --adapter "$dir" \
            --out "$W/dumps/$a-nf-dev.npz" > "$W/reports/$a-nf-dev.json"
        "$HR" lab dump --data "$D/msmarco-trec-dl-2019-passage" --trec-run BM25 --candidates 100 --store "$W/kv/dl19" \
            --adapter "$dir" --out "$W/dumps/$a-dl19.npz" > "$W/reports/$a-dl19.json"
    done
}

step_compare() {
    local nf=("NFCorpus dev hybrid@50") dl=("DL19 BM25@100")
    for a in packaged residual; do nf+=("$a=$W/dumps/$a-nf-dev.npz"); dl+=("$a=$W/dumps/$a-dl19.npz"); done
    "$PY" recipes/residual/compare.py --set "${nf[@]}" --set "${dl[@]}" | tee "$W/reports/compare.md"
}

for s in "${@:-${STEPS[@]}}"; do
    if [ $# -eq 0 ] && [ -f "$W/done/$s" ]; then continue; fi
    echo "[residual] $(date -u +%FT%TZ) step $s ..."
    "step_$s" 2>&1 | tee -a "$W/logs/$s.log"
    touch "$W/done/$s"
done
