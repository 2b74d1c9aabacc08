#!/usr/bin/env bash
# Set everything up, index BEIR NFCorpus from ../shared/data, and serve /search with
# attention reranking on http://127.0.0.1:${PORT:-8000}.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${HEEDRANK_DATA:-../shared/data}
INDEX=${HEEDRANK_INDEX:-indexes/nfcorpus}
PORT=${PORT:-8000}
if [ ! -f "$INDEX/params.json" ] && [ ! -d "$DATA/beir-nfcorpus" ]; then
  echo "demo: no BEIR NFCorpus at $DATA/beir-nfcorpus; put the shared data folder beside this checkout" \
       "(../shared/data) or set HEEDRANK_DATA=/path/to/shared/data" >&2
  exit 2
fi
bash scripts/setup.sh
if [ ! -f "$INDEX/params.json" ]; then
  # its parameters go to $INDEX/params.json, not to the terminal
  .venv/bin/heedrank index build --corpus "$DATA/beir-nfcorpus" --out "$INDEX" > /dev/null
  echo "indexed BEIR NFCorpus into $INDEX"
fi
# No wait for the document KV store: the service serves as soon as the models are loaded and fills the
# store in the background while it is idle (about 10 min for NFCorpus on 2 cores; it resumes after a restart).
# Until a candidate's block is stored, a search encodes at most HEEDRANK_COLD_BUDGET (4) cold ones inline
# and scores the others from their other signals, saying so ("skipped_cold", rerank.warnings);
# docs/results/store.md, "Bounded tiers". `heedrank index kv build --index "$INDEX"` fills it up front instead.
# The default configuration is the best measured one (README, "What ships"): cached BlockRank with the
# query adapter shipped for SmolLM2, read list-independently, and one scorer over its attention, the
# embedder's cosine and the first-stage rank (hybrid here); `"method": "icr"` in a request picks ICR.
HEEDRANK_DEFAULT_RETRIEVER=${HEEDRANK_DEFAULT_RETRIEVER:-hybrid} \
    .venv/bin/heedrank serve --index "$INDEX" --port "$PORT" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT INT TERM
READY=
for _ in $(seq 1 600); do
  if curl -fs "http://127.0.0.1:$PORT/health" 2>/dev/null | grep -q '"ok"'; then READY=1; break; fi
  kill -0 $SERVER 2>/dev/null || { echo "server exited" >&2; exit 1; }
  sleep 1
done
if [ -z "$READY" ]; then
  echo "the server did not report healthy within 600 s: see its log above, or curl http://127.0.0.1:$PORT/health" >&2
  exit 1
fi
cat <<MSG

heedrank is serving $INDEX on http://127.0.0.1:$PORT  (Ctrl-C stops it). Its document KV store fills
in the background (about 10 minutes on 2 cores; in GET /info, collections.default.kv_store.blocks counts up to
the number of distinct document texts, a little below num_docs, and "filling" turns false): until then a search reranks the candidates
whose blocks are stored plus up to 4 more (as many as its time budget allows), scores the others from their other
signals and says how many it skipped ("skipped_cold"). Try:

  curl -s http://127.0.0.1:$PORT/search -H 'Content-Type: application/json' \\
    -d '{"query": "vitamin D and bone fractures in the elderly", "top_k": 5, "explain": true}'
  curl -s http://127.0.0.1:$PORT/documents -H 'Content-Type: application/json' \\
    -d '{"documents": [{"id": "my-note-1", "title": "Note", "text": "Vitamin D3 with calcium lowered hip fractures.", "metadata": {"year": 2026}}]}'
  curl -s http://127.0.0.1:$PORT/documents/my-note-1

MSG
wait $SERVER
