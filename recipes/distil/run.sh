#!/usr/bin/env bash
# Distil SPLADE++'s rankings of TREC DL 2022 into the query adapter (docs/RESULTS.md, "SPLADE++
# distillation into the query adapter"): alone (DL 2022 only, from the base model, best step on
# DL 2021's labelled queries) and mixed (NFCorpus train + DL 2022, from the packaged adapter,
# best step on 60 NFCorpus dev queries); then dumps of every adapter and the served comparison.
#
#   bash recipes/distil/run.sh             # every step not done yet
#   bash recipes/distil/run.sh compare     # one step (again)
#
# Resumable as recipes/default/run.sh is (training resumes from its checkpoints, dumps resume).
# Settings: RECIPE_WORK (default runs/recipe/distil), RECIPE_INDEX (an NFCorpus index with its
# store, default indexes/nfcorpus), RECIPE_DATA (default ../shared/data).
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${RECIPE_WORK:-runs/recipe/distil}
D=${RECIPE_DATA:-../shared/data}
IDX=${RECIPE_INDEX:-indexes/nfcorpus}
HR=heedrank; [ -x .venv/bin/heedrank ] && HR=.venv/bin/heedrank
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
NF=$D/beir-nfcorpus
DL22="$D/msmarco-trec-dl-2022-passage@BM25~SPLADE_P_P_ENSEMBLE_DISTIL"
SHIPPED=reranker/data/smollm2-135m-instruct.query-adapter
mkdir -p "$W"/{done,dumps,kv,reports,logs}
STEPS=(alone mixed dumps compare)

step_alone() {
    "$HR" lab train query-adapter --train "$DL22" --dev "$D/msmarco-trec-dl-2021-passage@BM25" --dev-queries 53 \
        --candidates 30 --out "$W/alone" --steps 300 --batch-queries 2 --eval-every 50 --lr 3e-4 \
        --scratch-kv "$W/kv" > "$W/reports/alone.json"
}

step_mixed() {
    "$HR" lab train query-adapter --train "$NF:train" --train-queries 400 --train "$DL22" --dev "$NF:dev" \
        --dev-queries 60 --index "$IDX" --out "$W/mixed" --steps 200 --batch-queries 2 --eval-every 50 --lr 3e-4 \
        --init "$SHIPPED" --scratch-kv "$W/kv" > "$W/reports/mixed.json"
}

step_dumps() {
    for a in shipped alone mixed; do
        local dir=$SHIPPED; [ "$a" = shipped ] || dir=$W/$a/best
        "$HR" lab dump --data "$NF" --split dev --retriever hybrid --candidates 50 --index "$IDX" --adapter "$dir" \
            --out "$W/dumps/$a-nf-dev.npz" > "$W/reports/$a-nf-dev.json"
        "$HR" lab dump --data "$D/msmarco-trec-dl-2019-passage" --trec-run BM25 --candidates 100 --store "$W/kv/dl19" \
            --adapter "$dir" --out "$W/dumps/$a-dl19.npz" > "$W/reports/$a-dl19.json"
    done
}

step_compare() {
    local nf=("NFCorpus dev hybrid@50") dl=("DL19 BM25@100")
    for a in shipped alone mixed; do nf+=("$a=$W/dumps/$a-nf-dev.npz"); dl+=("$a=$W/dumps/$a-dl19.npz"); done
    "$PY" recipes/distil/compare.py --set "${nf[@]}" --set "${dl[@]}" | tee "$W/reports/compare.md"
}

for s in "${@:-${STEPS[@]}}"; do
    if [ $# -eq 0 ] && [ -f "$W/done/$s" ]; then continue; fi
    echo "[distil] $(date -u +%FT%TZ) step $s ..."
    "step_$s" 2>&1 | tee -a "$W/logs/$s.log"
    touch "$W/done/$s"
done
