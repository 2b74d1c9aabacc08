#!/usr/bin/env bash
# Rebuild a model's default reranker (the weights card and the query adapter of its cached
# BlockRank; the packaged ones are SmolLM2-135M-Instruct's) from ../shared/data. README.md beside
# this file says what each step does and how long it takes. Usage:
#
#   bash recipes/default/run.sh            # every step not done yet, in order
#   bash recipes/default/run.sh fit        # one step (again), e.g. after a fix to the scorer
#   RECIPE_MODEL=/models/my-lm RECIPE_DEVICE=cuda bash recipes/default/run.sh   # another model, on a GPU
#
# Resumable: each step is marked done in $RECIPE_WORK/done/ when it ends, and the commands inside
# a step resume what they were writing (dumps, adapter checkpoints) after a kill -9. Nothing is
# written into the package: the artefacts land in $RECIPE_WORK/out/, and `install` copies them
# over reranker/data/ for a commit (a packaged model), or into the user card folder
# ($HEEDRANK_CARD_DIR, default $HEEDRANK_CACHE_DIR/cards) for any other model.
#
# Settings (environment):
#   RECIPE_MODEL  the reranker LM: a packaged name (default smollm2-135m-instruct; gemma3-270m, ...)
#                 or a local Hugging Face causal-LM directory; passed as --model to every command
#                 that loads it
#   RECIPE_DEVICE torch device of those commands (default cpu; cuda, cuda:N)
#   RECIPE_LAYER  l*, the scoring layer (default round(0.5 L) of the model's L layers: 15 for SmolLM2)
#   RECIPE_WORK   work folder (default runs/recipe/default-<model-name>; ignored by git)
#   RECIPE_INDEX  NFCorpus index with its document store (default $RECIPE_WORK/index: built by
#                 the `index` step; an existing `heedrank index build` + `index kv build` folder
#                 for this model can be named instead, the step then only checks it)
#   RECIPE_DATA   the shared data (default ../shared/data)
#   RECIPE_WEB_OBJECTIVE  the web adapter's objective (web-adapter, web-choice): independent (default) or learned
#   RECIPE_WEB_STEPS  its optimizer steps (default 200)
#   RECIPE_MIXED_STEPS  the mixed adapter's optimizer steps (mixed-adapter; default 500)
#   RECIPE_SERVED the adapter the scorer is chosen, measured, assembled and installed with (scorer,
#                 scorer-eval, assemble, install-served): mixed (the mixed-adapter step's, default, the
#                 packaged one) or qa (the adapter step's)
#   RECIPE_CHOICE_TAGS  the adapters web-choice compares (default "qa web-<objective> mixed")
#   RECIPE_CALIBRATION_QUERIES  NFCorpus train queries for the cut-off maps (default: every one
#                 the adapter was not trained on, 2,190)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
HR=${HEEDRANK:-heedrank}
[ -x .venv/bin/heedrank ] && [ -z "${HEEDRANK:-}" ] && HR=.venv/bin/heedrank
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
M=${RECIPE_MODEL:-smollm2-135m-instruct}
DEV=${RECIPE_DEVICE:-cpu}
SETTINGS=$("$PY" recipes/default/steps.py model --model "$M")   # from the model's config, nothing assumed
eval "$SETTINGS"   # MODEL_NAME, MODEL_LAYERS, MODEL_HEADS, MODEL_LAYER
LAYER=${RECIPE_LAYER:-$MODEL_LAYER}
LM=(--model "$M" --device "$DEV")   # every command that loads the LM
W=${RECIPE_WORK:-runs/recipe/default-$MODEL_NAME}
D=${RECIPE_DATA:-../shared/data}
IDX=${RECIPE_INDEX:-$W/index}
NF=$D/beir-nfcorpus
mkdir -p "$W"/{done,dumps,kv,reports,out,logs}
train_ids() {  # the fit's and adapter's NFCorpus train queries, never calibrated on (a seeded folder: its list)
    if [ ! -f "$W/dumps/nf-train-hybrid50.npz" ] && [ -f "$W/train-queries.txt" ]; then echo "$W/train-queries.txt"
    else echo "$W/dumps/nf-train-hybrid50.npz"; fi
}
SERVED=${RECIPE_SERVED:-mixed}   # the adapter the default serves with (scorer, scorer-eval, assemble, install-served)
WEB_OBJ=${RECIPE_WEB_OBJECTIVE:-independent}   # the web adapter's training objective (web-adapter, web-choice)
adapter_of() {  # adapter_of TAG: the adapter a dump tag reads (qa: the NFCorpus one; web-OBJECTIVE: the web one; mixed)
    case $1 in qa) echo "$W/adapter/best" ;; mixed) echo "$W/mixed-adapter/best" ;; *) echo "$W/web-adapter-${1#web-}/best" ;; esac
}
echo "[recipe] model $M ($MODEL_NAME: $MODEL_LAYERS layers x $MODEL_HEADS heads), l* $LAYER, device $DEV, work $W"
STEPS=(index dumps fit adapter eval-dumps fusion calibration-dumps calibrate independent mixed-adapter scorer scorer-eval
       assemble)

dump() {  # dump NAME ARGS...: one feature dump, resumed if it was stopped
    local name=$1; shift
    "$HR" lab dump --out "$W/dumps/$name.npz" "${LM[@]}" --layer "$LAYER" "$@" > "$W/reports/$name.json"
}

step_index() {
    if [ ! -f "$IDX/params.json" ]; then
        "$HR" index build --corpus "$NF" --out "$IDX"
    fi
    if [ ! -f "$IDX/kv/header.json" ] || [ "${RECIPE_INDEX:-}" = "" ]; then
        "$HR" index kv build --index "$IDX" "${LM[@]}" --layer "$LAYER"   # resumes; a complete store returns at once
    fi
}

step_dumps() {  # the head-weight fit's features, base model (no adapter)
    dump nf-train-hybrid50 --data "$NF" --split train --retriever hybrid --candidates 50 --max-queries 400 --index "$IDX"
    dump dl21-bm25-30 --data "$D/msmarco-trec-dl-2021-passage" --trec-run BM25 --candidates 30 --store "$W/kv/dl21"
    dump scifact-train-bm25-30 --data "$D/beir-scifact" --split train --retriever bm25 --candidates 30 --max-queries 100 \
        --store "$W/kv/scifact"
    dump nf-dev-hybrid50 --data "$NF" --split dev --retriever hybrid --candidates 50 --index "$IDX"
}

step_fit() {  # head weights: pairwise, three sources, L2 chosen on NFCorpus dev (reads dumps: no LM)
    "$HR" lab fit --train "$W/dumps/nf-train-hybrid50.npz" --train "$W/dumps/dl21-bm25-30.npz" \
        --train "$W/dumps/scifact-train-bm25-30.npz" --dev "$W/dumps/nf-dev-hybrid50.npz" \
        --test "nfcorpus-dev-hybrid50=$W/dumps/nf-dev-hybrid50.npz" \
        --loss pairwise --temperature 1 --out "$W/reports/fit.json" --export "$W/out/card.fit.json"
}

step_adapter() {  # query-side LoRA, the fitted head weights fixed; best step on 60 dev queries
    "$HR" lab train query-adapter --train "$NF:train" --train-queries 400 --dev "$NF:dev" --dev-queries 60 \
        --index "$IDX" "${LM[@]}" --layer "$LAYER" --out "$W/adapter" --steps 600 --batch-queries 2 --eval-every 50 --lr 3e-4 \
        --opt "scorer_weights=$W/out/card.fit.json" > "$W/reports/adapter.json"
}

step_web_adapter() {  # not in the default order yet: the query adapter trained on web lists, through the objective
                      # RECIPE_WEB_OBJECTIVE (independent, the served list-independent log-odds; or learned). MS MARCO
                      # dev-600's train fold split by steps.py web-folds: 150 queries for the scorer's web source and 50
                      # dev queries (both never trained on); the rest (190 lists with a relevant passage) train it, from
                      # the NFCorpus adapter; the best step on the 50 dev queries is kept. Then the served features of
                      # dev-600's test fold, DL19 and the scorer's web source with it (web-<objective>-*.npz) beside the
                      # same with the NFCorpus adapter (qa-*.npz); heedrank lab compare-adapters reads them paired.
    local dev600=$D/msmarco-passage-dev-600
    "$PY" recipes/default/steps.py web-folds --data "$dev600" --out-dir "$W"
    "$HR" lab train query-adapter --objective "$WEB_OBJ" --train "$dev600@BM25:train" --candidates 20 \
        --dev "$dev600@BM25:train" --dev-query-ids "$W/web-dev-queries.txt" --exclude-queries "$W/web-dev-queries.txt" \
        --exclude-queries "$W/web-scorer-queries.txt" --scratch-kv "$W/kv" --init "$W/adapter/best" \
        "${LM[@]}" --layer "$LAYER" --out "$W/web-adapter-$WEB_OBJ" --steps "${RECIPE_WEB_STEPS:-200}" --batch-queries 2 \
        --eval-every 25 --lr 3e-4 --opt "scorer_weights=$W/out/card.fit.json" > "$W/reports/web-adapter-$WEB_OBJ.json"
    local tag
    for tag in qa "web-$WEB_OBJ"; do
        local ad=(--adapter "$(adapter_of "$tag")")
        dump "$tag-dev600-test-bm25-20" --data "$dev600" --trec-run BM25 --split test --candidates 20 \
            --store "$W/kv/dev600" "${ad[@]}"
        dump "$tag-dev600-scorer-bm25-20" --data "$dev600" --trec-run BM25 --split train --candidates 20 \
            --query-ids "$W/web-scorer-queries.txt" --store "$W/kv/dev600" "${ad[@]}"
        dump "$tag-dl19-bm25-100" --data "$D/msmarco-trec-dl-2019-passage" --trec-run BM25 --candidates 100 \
            --store "$W/kv/dl19" "${ad[@]}"
    done
}

step_mixed_adapter() {  # the packaged query adapter, trained through the served list-independent
                        # log-odds on three kinds of list at once, from the NFCorpus adapter: the adapter step's 400
                        # NFCorpus train queries (hybrid top 50), SciFact train claims (400 seeded, less the 100 of the
                        # scorer's SciFact source) and dev-600's train fold less its 150 scorer and 50 dev queries; DL21
                        # stays out (a held-out source of the scorer's choice). Best step on the 50 web dev queries.
    local dev600=$D/msmarco-passage-dev-600 sf=$W/dumps/scifact-train-bm25-30.npz
    "$PY" recipes/default/steps.py web-folds --data "$dev600" --out-dir "$W"
    [ -f "$W/independent-queries.txt" ] || "$PY" recipes/default/steps.py calibration-ids --data "$NF" \
        --exclude "$(train_ids)" --limit 400 --out "$W/independent-queries.txt"
    [ -f "$sf" ] || sf=$W/dumps/qa-scifact-train-bm25-30.npz   # a seeded folder: the same 100 claims
    "$HR" lab train query-adapter --objective independent --train "$NF:train" --train "$D/beir-scifact:train" \
        --train "$dev600@BM25:train" --train-queries 400 --candidates 50 --index "$IDX" \
        --dev "$dev600@BM25:train" --dev-query-ids "$W/web-dev-queries.txt" --exclude-queries "$W/web-dev-queries.txt" \
        --exclude-queries "$W/web-scorer-queries.txt" --exclude-queries "$W/independent-queries.txt" \
        --exclude-queries "$sf" --scratch-kv "$W/kv" --init "$W/adapter/best" "${LM[@]}" --layer "$LAYER" \
        --out "$W/mixed-adapter" --steps "${RECIPE_MIXED_STEPS:-500}" --batch-queries 2 --eval-every 50 --lr 3e-4 \
        --opt "scorer_weights=$W/out/card.fit.json" > "$W/reports/mixed-adapter.json"
}

step_web_choice() {  # not in the default order yet: the scorer's leave-one-source-out choice with each adapter of
                     # RECIPE_CHOICE_TAGS (default: qa, the NFCorpus adapter; web-<objective>; mixed), paired: the four
                     # sources (150 NFCorpus train queries, DL21, 100 SciFact claims, the 150 dev-600 scorer queries,
                     # trained on by none of them) and the test sets (dev-600's test fold, DL19) dumped with each
                     # (TAG-*.npz; a dump already whole returns at once), then lab choose-scorer on each set of four
    local dev600=$D/msmarco-passage-dev-600 tag
    [ -f "$W/independent-queries.txt" ] || "$PY" recipes/default/steps.py calibration-ids --data "$NF" \
        --exclude "$(train_ids)" --limit 400 --out "$W/independent-queries.txt"
    head -150 "$W/independent-queries.txt" > "$W/scorer-queries.txt"
    step_index
    for tag in ${RECIPE_CHOICE_TAGS:-qa web-$WEB_OBJ mixed}; do
        local ad=(--adapter "$(adapter_of "$tag")")
        dump "$tag-dev600-scorer-bm25-20" --data "$dev600" --trec-run BM25 --split train --candidates 20 \
            --query-ids "$W/web-scorer-queries.txt" --store "$W/kv/dev600" "${ad[@]}"
        dump "$tag-dl21-bm25-30" --data "$D/msmarco-trec-dl-2021-passage" --trec-run BM25 --candidates 30 \
            --store "$W/kv/dl21" "${ad[@]}"
        dump "$tag-scifact-train-bm25-30" --data "$D/beir-scifact" --split train --retriever bm25 --candidates 30 \
            --max-queries 100 --store "$W/kv/scifact" "${ad[@]}"
        dump "$tag-dev600-test-bm25-20" --data "$dev600" --trec-run BM25 --split test --candidates 20 \
            --store "$W/kv/dev600" "${ad[@]}"
        dump "$tag-dl19-bm25-100" --data "$D/msmarco-trec-dl-2019-passage" --trec-run BM25 --candidates 100 \
            --store "$W/kv/dl19" "${ad[@]}"
        dump "$tag-nf-train-scorer150-hybrid50" --data "$NF" --split train --retriever hybrid --candidates 50 \
            --index "$IDX" --query-ids "$W/scorer-queries.txt" "${ad[@]}"
        "$HR" lab choose-scorer --source "nf=$W/dumps/$tag-nf-train-scorer150-hybrid50.npz" \
            --source "dl21=$W/dumps/$tag-dl21-bm25-30.npz@2" --source "scifact=$W/dumps/$tag-scifact-train-bm25-30.npz" \
            --source "dev600=$W/dumps/$tag-dev600-scorer-bm25-20.npz:RR@10" --card "$W/out/card.fit.json" --index "$IDX" \
            --out "$W/reports/web-choice-$tag.json" | tee "$W/reports/web-choice-$tag.md"
    done
}

step_eval_dumps() {  # the served reranker's features (with the adapter): dev and the test sets (NFCorpus, DL19, dev-600's
                     # test fold, NovelEval; steps.py scorer-tables reads them)
    local a=(--adapter "$W/adapter/best")
    dump qa-nf-dev-hybrid50 --data "$NF" --split dev --retriever hybrid --candidates 50 --index "$IDX" "${a[@]}"
    dump qa-nf-test-hybrid50 --data "$NF" --split test --retriever hybrid --candidates 50 --index "$IDX" "${a[@]}"
    dump qa-nf-test-bm25-20 --data "$NF" --split test --retriever bm25 --candidates 20 --index "$IDX" "${a[@]}"
    dump qa-dl19-bm25-100 --data "$D/msmarco-trec-dl-2019-passage" --trec-run BM25 --candidates 100 \
        --store "$W/kv/dl19" "${a[@]}"
    dump qa-dev600-test-bm25-20 --data "$D/msmarco-passage-dev-600" --trec-run BM25 --split test --candidates 20 \
        --store "$W/kv/dev600" "${a[@]}"
    dump qa-noveleval-web-20 --data "$D/noveleval" --trec-run web --candidates 20 --store "$W/kv/noveleval" "${a[@]}"
}

step_fusion() {  # the fusion weight on dev, then every figure of the served configuration
    "$HR" lab fit --fixed-weights "default=$W/out/card.fit.json" --dev "$W/dumps/qa-nf-dev-hybrid50.npz" \
        --test "nfcorpus-test-hybrid50=$W/dumps/qa-nf-test-hybrid50.npz" \
        --test "nfcorpus-test-bm25-20=$W/dumps/qa-nf-test-bm25-20.npz" \
        --test "dl19-bm25-100=$W/dumps/qa-dl19-bm25-100.npz" --out "$W/reports/fusion.json"
}

step_calibration_dumps() {  # NFCorpus train queries the adapter never saw, with the adapter
    "$PY" recipes/default/steps.py calibration-ids --data "$NF" --exclude "$(train_ids)" \
        --limit "${RECIPE_CALIBRATION_QUERIES:-0}" --out "$W/calibration-queries.txt"
    dump qa-nf-train-unseen-hybrid50 --data "$NF" --split train --retriever hybrid --candidates 50 --index "$IDX" \
        --query-ids "$W/calibration-queries.txt" --adapter "$W/adapter/best"
}

step_calibrate() {  # the cut-off's Platt maps and thresholds (dev), on the card with the fusion weight
    "$PY" recipes/default/steps.py fused-card --card "$W/out/card.fit.json" --fusion "$W/reports/fusion.json" \
        --out "$W/out/card.fused.json"
    rm -f "$W/out/card.calibrated.json"
    "$HR" lab calibrate --card "$W/out/card.fused.json" --calibrate "$W/dumps/qa-nf-train-unseen-hybrid50.npz" \
        --exclude "$(train_ids)" --dev "$W/dumps/qa-nf-dev-hybrid50.npz" \
        --test "nf-test=$W/dumps/qa-nf-test-hybrid50.npz" --test "dl19=$W/dumps/qa-dl19-bm25-100.npz@2" \
        --counts 10,20,30,50 --test-counts 20,all --write-card "$W/out/card.calibrated.json" \
        --out "$W/reports/calibrate.json"
}

step_independent() {  # the list-independent scorer, with the adapter: 400 unseen NFCorpus train queries (seeded),
                      # TREC DL 2021 and 100 SciFact train claims
    "$PY" recipes/default/steps.py calibration-ids --data "$NF" --exclude "$(train_ids)" \
        --limit 400 --out "$W/independent-queries.txt"
    dump qa-nf-train-unseen400-hybrid50 --data "$NF" --split train --retriever hybrid --candidates 50 --index "$IDX" \
        --query-ids "$W/independent-queries.txt" --adapter "$W/adapter/best"
    dump qa-dl21-bm25-30 --data "$D/msmarco-trec-dl-2021-passage" --trec-run BM25 --candidates 30 --store "$W/kv/dl21" \
        --adapter "$W/adapter/best"
    dump qa-scifact-train-bm25-30 --data "$D/beir-scifact" --split train --retriever bm25 --candidates 30 \
        --max-queries 100 --store "$W/kv/scifact" --adapter "$W/adapter/best"
    rm -f "$W/out/card.independent.json"
    "$HR" lab fit-independent --train "$W/dumps/qa-nf-train-unseen400-hybrid50.npz" \
        --train "$W/dumps/qa-dl21-bm25-30.npz@2" --train "$W/dumps/qa-scifact-train-bm25-30.npz" \
        --dev "$W/dumps/qa-nf-dev-hybrid50.npz" --test "nf-test=$W/dumps/qa-nf-test-hybrid50.npz" \
        --test "dl19=$W/dumps/qa-dl19-bm25-100.npz@2" --card "$W/out/card.calibrated.json" \
        --write-card "$W/out/card.independent.json" --out "$W/reports/independent.json"
}

step_scorer() {  # the default's scorer over attention, dense and rank (one model per subset), with the served adapter
                 # (RECIPE_SERVED), chosen by leave-one-source-out over four sources, each weighing the same: 150 of the
                 # independent step's NFCorpus train queries (hybrid top 50), TREC DL 2021 (BM25 top 30), 100 SciFact
                 # train claims (BM25 top 30) and MS MARCO dev-600's train fold (BM25 top 20; with the mixed adapter,
                 # trained on part of it, its 150 scorer queries; its one-positive qrels choose the direction, not
                 # the probability: --rank-only); the cut-off on 150 seeded NFCorpus dev queries
                 # (heedrank lab choose-scorer: dumps and the index, no LM). Each dump resumes where it stopped.
    local card=$W/out/card.independent.json t=$SERVED ad=(--adapter "$(adapter_of "$SERVED")") web
    [ -f "$card" ] || card=$W/out/card.fit.json   # a seeded folder: the installed card's independent entry
    head -150 "$W/independent-queries.txt" > "$W/scorer-queries.txt"
    dump "$t-nf-train-scorer150-hybrid50" --data "$NF" --split train --retriever hybrid --candidates 50 --index "$IDX" \
        --query-ids "$W/scorer-queries.txt" "${ad[@]}"
    [ -f "$W/dumps/$t-dl21-bm25-30.npz" ] || dump "$t-dl21-bm25-30" --data "$D/msmarco-trec-dl-2021-passage" \
        --trec-run BM25 --candidates 30 --store "$W/kv/dl21" "${ad[@]}"
    [ -f "$W/dumps/$t-scifact-train-bm25-30.npz" ] || dump "$t-scifact-train-bm25-30" --data "$D/beir-scifact" \
        --split train --retriever bm25 --candidates 30 --max-queries 100 --store "$W/kv/scifact" "${ad[@]}"
    if [ "$t" = qa ]; then
        web=$t-dev600-train-bm25-20
        dump "$web" --data "$D/msmarco-passage-dev-600" --trec-run BM25 --split train --candidates 20 \
            --store "$W/kv/dev600" "${ad[@]}"
    else
        web=$t-dev600-scorer-bm25-20
        dump "$web" --data "$D/msmarco-passage-dev-600" --trec-run BM25 --split train --candidates 20 \
            --query-ids "$W/web-scorer-queries.txt" --store "$W/kv/dev600" "${ad[@]}"
    fi
    dump "$t-nf-dev150-hybrid50" --data "$NF" --split dev --retriever hybrid --candidates 50 --max-queries 150 \
        --index "$IDX" "${ad[@]}"
    rm -f "$W/out/card.chosen.json" "$W/out/card.scorer.json"
    "$HR" lab choose-scorer --source "nf=$W/dumps/$t-nf-train-scorer150-hybrid50.npz" \
        --source "dl21=$W/dumps/$t-dl21-bm25-30.npz@2" --source "scifact=$W/dumps/$t-scifact-train-bm25-30.npz" \
        --source "dev600=$W/dumps/$web.npz:RR@10" --rank-only dev600 --dev "$W/dumps/$t-nf-dev150-hybrid50.npz" \
        --card "$card" --index "$IDX" --write-card "$W/out/card.chosen.json" --out "$W/reports/scorer.json"
    # the query gate: how the attention's weight falls past the four sources' longest query, chosen on 200 NFCorpus
    # train documents used as queries (lab long-queries: median 223 words; lab choose-gate)
    [ -f "$W/long-nf-docs/queries.jsonl" ] || "$HR" lab long-queries --data "$NF" --out "$W/long-nf-docs" --queries 200
    dump "$t-long-nfdocs-bm25-30" --data "$W/long-nf-docs" --split train --retriever bm25 --candidates 30 --index "$IDX" \
        "${ad[@]}"
    "$HR" lab choose-gate --source "nf=$W/dumps/$t-nf-train-scorer150-hybrid50.npz" \
        --source "dl21=$W/dumps/$t-dl21-bm25-30.npz@2" --source "scifact=$W/dumps/$t-scifact-train-bm25-30.npz" \
        --source "dev600=$W/dumps/$web.npz:RR@10" --long "long=$W/dumps/$t-long-nfdocs-bm25-30.npz" \
        --card "$W/out/card.chosen.json" --index "$IDX" --write-card "$W/out/card.scorer.json" \
        --out "$W/reports/gate.json" | tee "$W/reports/gate.md"
}

step_gate_check() {  # not in the default order: the query gate read on a second long-query source it was not chosen on:
                    # TREC DL 2021 passages judged 3 as queries (lab long-queries --kind passages; median 48 words),
                    # BM25 top 30 over the pool of the year's runs; reports/gate-check.md
    local t=$SERVED ad=(--adapter "$(adapter_of "$SERVED")")
    [ -f "$W/long-dl21-passages/queries.jsonl" ] || "$HR" lab long-queries --kind passages \
        --data "$D/msmarco-trec-dl-2021-passage" --out "$W/long-dl21-passages"
    dump "$t-long-dl21passages-bm25-30" --data "$W/long-dl21-passages" --split train --retriever bm25 --candidates 30 \
        --store "$W/kv/dl21" "${ad[@]}"
    "$HR" lab choose-gate --source "nf=$W/dumps/$t-nf-train-scorer150-hybrid50.npz" \
        --source "dl21=$W/dumps/$t-dl21-bm25-30.npz@2" --source "scifact=$W/dumps/$t-scifact-train-bm25-30.npz" \
        --source "dev600=$W/dumps/$t-dev600-scorer-bm25-20.npz:RR@10" \
        --long "passages=$W/dumps/$t-long-dl21passages-bm25-30.npz@2" --card "$W/out/card.chosen.json" --index "$IDX" \
        --out "$W/reports/gate-check.json" | tee "$W/reports/gate-check.md"
}

step_probability_check() {  # not in the default order: does the served probability mean what it says? The card
                            # out/card.scorer.json on the scorer step's dumps (its three calibrating sources) and on
                            # DL19 and NFCorpus dev (never fitted): relevant share, mean P, ECE and /rerank's
                            # reliability per bin of P (heedrank lab check-probability; reports/reliability.md)
    local t=$SERVED d=$W/dumps
    "$HR" lab check-probability --card "served=$W/out/card.scorer.json" \
        --test "nf-train=$d/$t-nf-train-scorer150-hybrid50.npz" --test "dl21=$d/$t-dl21-bm25-30.npz@2" \
        --test "scifact=$d/$t-scifact-train-bm25-30.npz" --test "dl19=$d/$t-dl19-bm25-100.npz@2" \
        --test "nf-dev=$d/$t-nf-dev150-hybrid50.npz" --index "$IDX" \
        --out "$W/reports/reliability.json" | tee "$W/reports/reliability.md"
}

step_scorer_eval() {  # the served default through the product (eval beir / trec-dl) beside the embedder alone
                      # (--rerank dense) and the first stage alone, every test query (NFCorpus test, DL19, dev-600's
                      # test fold, NovelEval with its web order); the figures go into the card
    local o=(--opt "scorer_weights=$W/out/card.scorer.json" --opt "query_adapter=$(adapter_of "$SERVED")")
    local e=$W/reports/eval
    for m in none dense default; do
        local x=(); [ "$m" = default ] && x=("${o[@]}")
        "$HR" eval beir --data "$NF" --split test --retriever hybrid --candidates 50 --index "$IDX" --rerank "$m" \
            --out "$e/nf-test-hybrid50/$m" "${x[@]}"
        "$HR" eval beir --data "$NF" --split test --retriever bm25 --candidates 20 --index "$IDX" --rerank "$m" \
            --out "$e/nf-test-bm25-20/$m" "${x[@]}"
        "$HR" eval trec-dl --data "$D/msmarco-trec-dl-2019-passage" --candidates 100 --rerank "$m" \
            --out "$e/dl19-bm25-100/$m" "${x[@]}"
        "$HR" eval trec-dl --data "$D/msmarco-passage-dev-600" --split test --candidates 20 --rerank "$m" \
            --out "$e/dev600-test/$m" "${x[@]}"
        "$HR" eval trec-dl --data "$D/noveleval" --run web --candidates 20 --rerank "$m" \
            --out "$e/noveleval-web/$m" "${x[@]}"
    done
    "$PY" recipes/default/steps.py scorer-figures --work "$W"
}

step_seed() {  # not in the default order: re-measure the installed card and adapter (e.g. on a store of
               # another layout) by the steps after `adapter`, without refitting or retraining them
    "$PY" recipes/default/steps.py seed --work "$W" --model "$M" --data "$NF"
}

step_assemble() {  # the packaged artefacts (the card, and the adapter the scorer was chosen with: RECIPE_SERVED), their
                   # fields naming only files of the repository
    "$PY" recipes/default/steps.py assemble --work "$W" --model "$M" --adapter "$(adapter_of "$SERVED")" --tag "$SERVED"
}

step_install_served() {  # the scorer step's scorer and the adapter it was chosen with (RECIPE_SERVED) into the installed
                         # card and adapter (a seeded folder; the rest of the card unchanged): review `git diff`, commit
    "$PY" recipes/default/steps.py install-served --work "$W" --model "$M" --adapter "$(adapter_of "$SERVED")" \
        --tag "$SERVED"
}

step_install() {  # copy out/ over the packaged artefacts (then review `git diff` and commit), or into the user card folder
    "$PY" recipes/default/steps.py install --work "$W" --model "$M"
}

run_step() {
    local s=$1 t0 t1
    t0=$(date +%s)
    echo "[recipe] $(date -u +%FT%TZ) step $s ..."
    "step_${s//-/_}" 2>&1 | tee -a "$W/logs/$s.log"
    t1=$(date +%s)
    printf '%s\t%s\t%s\n' "$s" "$((t1 - t0))" "$(date -u +%FT%TZ)" >> "$W/steps.tsv"
    touch "$W/done/$s"
    echo "[recipe] step $s done in $((t1 - t0)) s"
}

if [ $# -gt 0 ]; then
    for s in "$@"; do run_step "$s"; done
else
    for s in "${STEPS[@]}"; do
        [ -f "$W/done/$s" ] || run_step "$s"
    done
    echo "[recipe] every step done: out/ is in $W/out; 'bash recipes/default/run.sh install' installs it (reranker/data for a packaged model, else the user card folder)"
fi
