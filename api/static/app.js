// heedrank search page. Plain JavaScript, no build step, no dependencies.
//
// Safety: every string that comes from the service (documents are untrusted) is put on
// the page as text (textContent, Text nodes, attributes via setAttribute); this file never
// assigns HTML markup.
"use strict";

(() => {
  const KEY_STORAGE = "heedrank.apiKey";
  const STAGES = ["queue", "retrieve", "hydrate", "rerank"];
  const $ = (id) => document.getElementById(id);

  let info = null;          // last GET /info body
  let retrieverChosen = false;  // the user picked a first stage: /info no longer sets it
  let searchSeq = 0;        // answers of superseded searches are dropped
  let infoTimer = null;

  // ------------------------------------------------------------------ DOM helpers
  /** An element with attributes ({class, text, ...}) and children (nodes or strings, as text). */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = String(v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) {
      if (c === undefined || c === null || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function show(node, on) { node.hidden = !on; }

  function fmtMs(seconds) {
    const ms = Number(seconds) * 1000;
    if (!Number.isFinite(ms)) return "?";
    return ms >= 100 ? `${ms.toFixed(0)} ms` : ms >= 10 ? `${ms.toFixed(1)} ms` : `${ms.toFixed(2)} ms`;
  }

  function fmtScore(x) {
    const n = Number(x);
    return Number.isFinite(n) ? n.toPrecision(4) : String(x);
  }

  function jsonText(value) {
    return typeof value === "string" ? value : JSON.stringify(value);
  }

  // ------------------------------------------------------------------ API access
  class ApiError extends Error {
    constructor(status, type, message, retryAfter) {
      super(message);
      this.status = status;
      this.type = type;
      this.retryAfter = retryAfter;
    }
  }

  function apiKey() {
    try { return sessionStorage.getItem(KEY_STORAGE) || ""; } catch (e) { return ""; }
  }

  /** Calls the service (a path relative to this page) and returns its JSON body; an answer
   *  that is not 2xx throws ApiError with the service's own error_type and message. */
  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const key = apiKey();
    if (key) headers.Authorization = `Bearer ${key}`;
    let resp;
    try {
      resp = await fetch(path, {
        method, headers, cache: "no-store",
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      throw new ApiError(0, "network_error", `no answer from the service (${e.message || e})`);
    }
    const raw = await resp.text();
    let data = null;
    try { data = raw ? JSON.parse(raw) : null; } catch (e) { data = null; }
    if (!resp.ok) {
      const type = data && typeof data.error_type === "string" ? data.error_type : `http_${resp.status}`;
      const message = data && typeof data.error === "string" ? data.error
        : (raw.trim().slice(0, 500) || resp.statusText || "no message");
      throw new ApiError(resp.status, type, message, resp.headers.get("Retry-After"));
    }
    if (data === null || typeof data !== "object") {
      throw new ApiError(resp.status, "bad_response", "the service answered without a JSON body");
    }
    return data;
  }

  /** Shows an error as the service gave it: error_type, message, Retry-After. */
  function showError(box, err) {
    box.replaceChildren();
    if (!(err instanceof ApiError)) err = new ApiError(0, "client_error", String(err && err.message || err));
    box.dataset.type = err.type;
    box.append(el("span", { class: "etype", text: err.type }), " ");
    if (err.status) box.append(el("span", { class: "muted", text: `HTTP ${err.status}:` }), " ");
    box.append(el("span", { class: "emsg", text: err.message }));
    if (err.retryAfter) {
      box.append(" ", el("span", { class: "retry", text: `Retry after ${err.retryAfter} s.` }));
    }
    if (err.status === 401) {
      box.append(" ", el("span", { class: "retry", text: "Enter the service's API key at the top of the page." }));
    }
    show(box, true);
  }

  function clearBox(box) { box.replaceChildren(); delete box.dataset.type; show(box, false); }

  function setFieldError(input, box, message, type) {
    box.replaceChildren();
    if (type) box.append(el("span", { class: "etype", text: type }), " ");
    box.append(el("span", { class: "emsg", text: message }));
    show(box, true);
    input.setAttribute("aria-invalid", "true");
  }

  function clearFieldError(input, box) {
    clearBox(box);
    input.removeAttribute("aria-invalid");
  }

  /** A JSON object from a textarea: null when empty; throws Error with a readable message. */
  function parseJsonObject(text, what) {
    if (!text.trim()) return null;
    let value;
    try { value = JSON.parse(text); } catch (e) { throw new Error(`${what} is not valid JSON: ${e.message}`); }
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      throw new Error(`${what} must be a JSON object ({...})`);
    }
    return value;
  }

  // ------------------------------------------------------------------ service info
  function option(value, label, selected) {
    const o = el("option", { value, text: label });
    o.selected = !!selected;
    return o;
  }

  function fillRetrievers() {
    const sel = $("retriever");
    const current = sel.value;
    const coll = info && info.collections ? info.collections[$("collection").value] : null;
    const names = coll && Array.isArray(coll.retrievers) && coll.retrievers.length ? coll.retrievers : ["bm25"];
    sel.replaceChildren(...names.map((n) => option(n, n, n === current)));
    const dflt = info && info.reranker && info.reranker.default_retriever;
    if (!names.includes(current) || (!retrieverChosen && names.includes(dflt))) {
      sel.value = names.includes(dflt) ? dflt : (names.includes("bm25") ? "bm25" : names[0]);
    }
  }

  function collectionLabel(name, c) {
    return c && c.num_docs !== null && c.num_docs !== undefined ? `${name} (${c.num_docs} docs)` : name;
  }

  function applyInfo(data) {
    const first = info === null;
    info = data;
    const svc = $("service");
    const status = el("span", { class: data.status === "ok" ? "ok" : "bad", text: data.status });
    const model = data.reranker && data.reranker.model;  // the loaded reranker's describe()
    const lm = model && model.model && typeof model.model === "object" ? model.model.name : null;
    svc.replaceChildren(
      `v${data.version} · status `, status,
      ` · reranker ${data.reranker ? data.reranker.method : "?"}`, lm ? ` on ${jsonText(lm)}` : "",
      data.auth ? " · API key required" : "",
    );

    const collSel = $("collection");
    const chosen = collSel.value || data.default_collection;
    const names = Object.keys(data.collections || {});
    collSel.replaceChildren(...names.map((n) => option(n, collectionLabel(n, data.collections[n]), n === chosen)));
    fillRetrievers();

    if (first) {
      const methods = new Set((data.reranker && data.reranker.methods) || []);
      methods.add("none");
      const dflt = data.reranker ? data.reranker.method : "none";
      const label = (m) => (m === "none" ? "none (first stage only)" : m === dflt ? `${m} (the service's)` : m);
      $("method").replaceChildren(...[...methods].sort().map((m) => option(m, label(m), m === dflt)));
      syncMethod();
    }
    const limits = data.limits || {};
    if (limits.max_top_k) $("top-k").max = limits.max_top_k;
    if (limits.max_candidates) {
      $("candidates").max = limits.max_candidates;
      $("candidates").placeholder = "default";
    }
    if (limits.max_query_chars) $("q").maxLength = limits.max_query_chars;

    clearTimeout(infoTimer);
    if (data.status === "loading") infoTimer = setTimeout(loadInfo, 2000);  // models still loading
  }

  async function loadInfo() {
    try {
      applyInfo(await api("GET", "info"));
      // the service answers now: an error about /info or a missing key is over
      const box = $("error");
      if (box.dataset.source === "info" || box.dataset.type === "unauthorized") clearBox(box);
    } catch (err) {
      $("service").replaceChildren(el("span", { class: "bad", text: err.type || "error" }),
        " · the service's /info could not be read");
      showError($("error"), err);
      $("error").dataset.source = "info";
    }
  }

  function syncMethod() {
    const method = $("method").value;
    const none = method === "none";
    const able = new Set((info && info.reranker && info.reranker.explain_methods) || []);
    $("candidates").disabled = none;
    $("fusion").disabled = none;
    $("cutoff").disabled = none;
    // Explain is ticked (and can be) only for a method that gives evidence
    $("explain").disabled = none || !able.has(method);
    $("explain").checked = !$("explain").disabled;
  }

  // ------------------------------------------------------------------ search
  function searchBody() {
    const body = { query: $("q").value };  // before /info answers, the selects hold "" = the service's choice
    if ($("retriever").value) body.retriever = $("retriever").value;
    const coll = $("collection").value;
    if (coll) body.collection = coll;
    const k = parseInt($("top-k").value, 10);
    if (!Number.isNaN(k)) body.top_k = k;
    const method = $("method").value;
    if (method !== "none") {
      body.rerank = method ? { method } : {};
      const c = parseInt($("candidates").value, 10);
      if (!Number.isNaN(c)) body.rerank.candidates = c;
      const fusion = $("fusion").value;
      if (fusion && fusion !== "default") body.rerank.fusion = fusion === "none" ? "none" : parseFloat(fusion);
      const cutoff = $("cutoff").value;
      if (cutoff) body.rerank.cutoff = cutoff === "auto" ? "auto" : parseFloat(cutoff);
      if ($("explain").checked && !$("explain").disabled) body.explain = true;
    } else {
      body.rerank = false;  // the service reranks unless asked not to
    }
    const filter = parseJsonObject($("filter").value, "the filter");
    if (filter !== null) body.filter = filter;
    return body;
  }

  async function runSearch() {
    const seq = ++searchSeq;
    const errBox = $("error");
    clearBox(errBox);
    errBox.dataset.source = "";
    clearFieldError($("filter"), $("filter-error"));
    if (!$("q").value.trim()) {
      $("status").textContent = "Type a query first.";
      $("q").focus();
      return;
    }
    let body;
    try {
      body = searchBody();
    } catch (e) {
      setFieldError($("filter"), $("filter-error"), e.message);
      $("status").textContent = "The filter needs fixing.";
      return;
    }
    $("status").textContent = "Searching…";
    $("results").setAttribute("aria-busy", "true");
    try {
      const data = await api("POST", "search", body);
      if (seq !== searchSeq) return;
      renderResults(data, body);
    } catch (err) {
      if (seq !== searchSeq) return;
      if (err.status === 422 && /^filter\b/.test(err.message)) {
        setFieldError($("filter"), $("filter-error"), err.message, err.type);
        $("status").textContent = "The service refused the filter.";
      } else {
        showError(errBox, err);
        $("status").textContent = "The search failed.";
      }
    } finally {
      if (seq === searchSeq) $("results").removeAttribute("aria-busy");
    }
  }

  /** Text with its evidence spans as <mark> elements. Offsets are Python's (code points),
   *  so the text is cut by code points, not UTF-16 units. Overlapping spans keep the first. */
  function highlighted(text, spans, lo, hi) {
    const chars = Array.from(text);
    const frag = document.createDocumentFragment();
    const sorted = spans.filter((s) => Number.isInteger(s.start) && Number.isInteger(s.end) && s.end > s.start)
      .sort((a, b) => a.start - b.start || b.end - a.end);
    let pos = 0;
    for (const s of sorted) {
      if (s.start < pos || s.end > chars.length) continue;
      if (s.start > pos) frag.append(chars.slice(pos, s.start).join(""));
      const level = hi > lo ? 1 + Math.round(4 * (Number(s.score) - lo) / (hi - lo)) : 5;
      frag.append(el("mark", {
        class: "ev", "data-level": level, "data-start": s.start, "data-end": s.end, "data-score": s.score,
        title: `evidence, score ${fmtScore(s.score)}`,
      }, chars.slice(s.start, s.end).join("")));
      pos = s.end;
    }
    if (pos < chars.length) frag.append(chars.slice(pos).join(""));
    return frag;
  }

  function moveBadge(hit) {
    const from = hit.first_stage_rank;
    if (!Number.isInteger(from) || from === hit.rank) return null;
    const up = from > hit.rank;
    return el("span", {
      class: `move ${up ? "up" : "down"}`,
      title: `first-stage rank ${from}, final rank ${hit.rank}`,
    }, el("span", { class: "visually-hidden", text: "moved from first-stage rank " }), `${from} → ${hit.rank}`);
  }

  function metadataLine(meta) {
    const keys = Object.keys(meta || {});
    if (!keys.length) return null;
    const p = el("p", { class: "metadata" }, "metadata: ");
    keys.forEach((k, i) => {
      if (i) p.append(" · ");
      p.append(el("code", { text: k }), ` ${jsonText(meta[k])}`);
    });
    return p;
  }

  function scoreLine(hit, calibrated) {
    // the one score to read: a reranked hit's calibrated probability (or sigmoid score), a first-stage score
    // without reranking; the order's own key stays in the title (raw_score)
    const raw = `raw score ${fmtScore(hit.raw_score)}`;
    if (hit.reranked === false && calibrated && Number.isFinite(hit.score)) {
      // the scorer served it from its other signals (its block not read by the LM): a probability all the same
      return el("span", { title: raw }, "P(relevant) ", el("code", { class: "probability", text: Number(hit.score).toFixed(2) }),
        " ", el("span", { class: "not-reranked", text: "not read by the LM" }));
    }
    if (hit.reranked === false) return el("span", { class: "not-reranked", title: raw, text: "not reranked" });
    if (calibrated && Number.isFinite(hit.score)) {
      return el("span", { title: raw }, "P(relevant) ",
        el("code", { class: "probability", text: Number(hit.score).toFixed(2) }));
    }
    return el("span", { title: raw }, "score ", el("code", { class: "score", text: fmtScore(hit.score) }));
  }

  function renderHit(hit, lo, hi, calibrated) {
    const spans = Array.isArray(hit.evidence) ? hit.evidence : [];
    const textSpans = spans.filter((s) => s.field === "text");
    const titleSpans = spans.filter((s) => s.field === "title");
    const title = el("h3", { class: hit.title ? "hit-title" : "hit-title untitled" });
    if (hit.title) title.append(highlighted(hit.title, titleSpans, lo, hi));
    else title.textContent = "(untitled)";

    const openBtn = el("button", {
      type: "button", class: "open-doc", text: "Edit in panel", "aria-label": `Edit ${hit.doc_id} in the document panel`,
    });
    openBtn.addEventListener("click", () => {
      fillDocForm({ id: hit.doc_id, title: hit.title, text: hit.text, metadata: hit.metadata });
      $("doc-id").focus();
    });
    return el("li", { class: "hit", "data-doc-id": hit.doc_id },
      el("div", { class: "hit-head" },
        el("span", { class: "rank", text: `#${hit.rank}` }),
        title,
        moveBadge(hit)),
      el("div", { class: "hit-meta" },
        el("span", {}, "id ", el("code", { class: "doc-id", text: hit.doc_id })),
        scoreLine(hit, calibrated),
        Number.isInteger(hit.first_stage_rank) ? el("span", { text: `first stage #${hit.first_stage_rank}` }) : null,
        spans.length ? el("span", { text: `${spans.length} evidence span${spans.length > 1 ? "s" : ""}` }) : null),
      el("p", { class: "hit-text" }, highlighted(hit.text || "", textSpans, lo, hi)),
      metadataLine(hit.metadata),
      el("div", { class: "hit-actions" }, openBtn));
  }

  function renderTimings(t) {
    const bar = $("timing-bar");
    const legend = $("timing-legend");
    const vals = STAGES.map((s) => Math.max(0, Number(t[s]) || 0));
    const sum = vals.reduce((a, b) => a + b, 0) || 1;
    bar.replaceChildren(...STAGES.map((s, i) => {
      const seg = el("span", { class: `seg-${s}`, title: `${s} ${fmtMs(vals[i])}` });
      seg.style.width = `${(100 * vals[i]) / sum}%`;
      return seg;
    }));
    bar.setAttribute("aria-label", STAGES.map((s, i) => `${s} ${fmtMs(vals[i])}`).join(", "));
    legend.replaceChildren(
      ...STAGES.map((s, i) => el("li", { "data-stage": s },
        el("span", { class: `sw seg-${s}`, "aria-hidden": "true" }), `${s} ${fmtMs(vals[i])}`)),
      el("li", { "data-stage": "total" }, `total ${fmtMs(t.total)} (without queue)`),
    );
  }

  // The method a response names, with the one asked for when the service resolved an alias
  // ("default (blockrank-cached)": the default is cached BlockRank read by the card's scorer).
  function methodLabel(rr, asked) {
    return asked && asked !== rr.method ? `${asked} (${rr.method})` : rr.method;
  }

  function renderRerankInfo(rr, asked) {
    const dl = $("rerank-info");
    const rows = [];
    const add = (k, v) => rows.push(el("dt", { text: k }), el("dd", { "data-key": k, text: v }));
    if (!rr) {
      add("method", "none (first-stage order)");
    } else {
      add("method", methodLabel(rr, asked));
      add("candidates", rr.candidates);
      if (rr.prompt_tokens !== undefined) add("prompt tokens", rr.prompt_tokens);
      const read = Number.isFinite(rr.doc_tokens) ? `the first ${rr.doc_tokens} tokens of each document` : "";
      const scored = Number.isInteger(rr.reranked) ? rr.reranked : rr.candidates;  // truncation counts read ones
      add("read", `${read}${read && rr.truncated ? `; ${rr.truncated} of ${scored} are longer` : ""}`
        || `${rr.truncated || 0} truncated`);
      if (rr.skipped_cold && rr.calibrated && rr.reranked > 0) {
        add("reranked", `${rr.reranked} of ${rr.candidates}; ${rr.skipped_cold} whose blocks are not stored yet were `
          + "scored from the other signals (the service stores them in the background)");
      } else if (rr.skipped_cold) {
        add("reranked", `${rr.reranked} of ${rr.candidates}; ${rr.skipped_cold} whose blocks are not stored yet keep `
          + "their first-stage places (the service stores them in the background)");
      } else if (rr.reranked === 0) {
        add("reranked", `0 of ${rr.candidates}: every candidate kept its first-stage place (see the warning)`);
      }
      for (const [k, v] of Object.entries(rr)) {  // e.g. cache hits, when the service reports them
        if (["method", "candidates", "prompt_tokens", "truncated", "doc_tokens", "warnings", "reranked",
             "skipped_cold"].includes(k)) continue;
        if (v === null || v === undefined) continue;
        add(k.replace(/_/g, " "), jsonText(v));
      }
      for (const w of Array.isArray(rr.warnings) ? rr.warnings : []) add("warning", w);
    }
    dl.replaceChildren(...rows);
  }

  // What the reranker did, for the status line: how many candidates it reranked, and how many kept
  // their first-stage places and why (blocks not yet in the document KV store; the time budget ran out).
  function rerankSummary(rr, moved, asked) {
    const total = Number.isInteger(rr.candidates) ? rr.candidates : 0;
    const scored = Number.isInteger(rr.reranked) ? rr.reranked : total;
    const kept = Math.max(0, total - scored);
    let text = `reranked ${scored} of ${total} by ${methodLabel(rr, asked)}`;
    if (kept && rr.calibrated && scored > 0) {  // the scorer placed the others from its other signals
      text += `; ${kept} not read by the LM${rr.skipped_cold ? " (not yet in the store)" : ""}, scored from the `
        + `other signals; of the results shown, ${moved} moved`;
    } else if (kept) {
      const why = [];
      if (rr.skipped_cold) why.push(`${rr.skipped_cold === kept ? "" : `${rr.skipped_cold} `}not yet in the store`);
      const budget = (Array.isArray(rr.warnings) ? rr.warnings : []).some((w) => /budget/.test(w));
      if (scored === 0 && budget) why.push("the reranking ran past the service's time budget");
      text += `; ${kept} kept ${kept === 1 ? "its" : "their"} first-stage place${kept === 1 ? "" : "s"}`
        + (why.length ? `: ${why.join("; ")}` : "")
        + `; of the results shown, ${moved} moved`;  // after the reasons, not read as one of them
    } else {
      text += ` (${moved} moved)`;
    }
    return text;
  }

  function renderResults(data, body) {
    const hits = Array.isArray(data.results) ? data.results : [];
    const scores = hits.flatMap((h) => (Array.isArray(h.evidence) ? h.evidence : []).map((s) => Number(s.score)))
      .filter(Number.isFinite);
    const lo = scores.length ? Math.min(...scores) : 0;
    const hi = scores.length ? Math.max(...scores) : 0;
    $("results").replaceChildren(...hits.map((h) => renderHit(h, lo, hi, Boolean(data.rerank && data.rerank.calibrated))));
    renderTimings(data.timings || {});
    const asked = body.rerank && body.rerank.method;
    renderRerankInfo(data.rerank || null, asked);
    show($("run-info"), true);
    const n = hits.length;
    const moved = hits.filter((h) => Number.isInteger(h.first_stage_rank) && h.first_stage_rank !== h.rank).length;
    const cut = data.rerank && Number.isFinite(data.rerank.cutoff) ? data.rerank.cutoff : null;
    $("status").textContent = `${n} result${n === 1 ? "" : "s"} for “${body.query}”`
      + (data.rerank ? `, ${rerankSummary(data.rerank, moved, asked)}` : "")
      + (cut !== null ? `, cut off at P(relevant) ≥ ${cut.toFixed(2)}` : "")
      + ` in ${fmtMs((data.timings || {}).total)}.`;
  }

  // ------------------------------------------------------------------ document panel
  function fillDocForm(doc) {
    $("doc-id").value = doc.id || "";
    $("doc-title").value = doc.title || "";
    $("doc-text").value = doc.text || "";
    const meta = doc.metadata || {};
    $("doc-metadata").value = Object.keys(meta).length ? JSON.stringify(meta, null, 1) : "";
  }

  function collectionParam() {
    const c = $("collection").value;
    return c ? `?collection=${encodeURIComponent(c)}` : "";
  }

  function docPath(id) { return `documents/${encodeURIComponent(id)}${collectionParam()}`; }

  function updateCount(collection, numDocs) {
    if (!info || !info.collections || !info.collections[collection]) return;
    info.collections[collection].num_docs = numDocs;
    for (const o of $("collection").options) {
      if (o.value === collection) o.textContent = collectionLabel(collection, info.collections[collection]);
    }
  }

  async function docAction(kind) {
    const errBox = $("doc-error");
    const status = $("doc-status");
    clearBox(errBox);
    clearFieldError($("doc-metadata"), $("doc-metadata-error"));
    const id = $("doc-id").value.trim();
    if (!id) {
      status.textContent = "Enter a document id first.";
      $("doc-id").focus();
      return;
    }
    try {
      if (kind === "save") {
        let metadata;
        try {
          metadata = parseJsonObject($("doc-metadata").value, "the metadata") || {};
        } catch (e) {
          setFieldError($("doc-metadata"), $("doc-metadata-error"), e.message);
          status.textContent = "The metadata needs fixing.";
          return;
        }
        status.textContent = `Saving ${id}…`;
        const body = { documents: [{ id, title: $("doc-title").value, text: $("doc-text").value, metadata }] };
        if ($("collection").value) body.collection = $("collection").value;
        const r = await api("POST", "documents", body);
        updateCount(r.collection, r.num_docs);
        status.textContent = `${r.added.length ? "Added" : "Replaced"} ${id} in ${r.collection}; `
          + `it now holds ${r.num_docs} documents.`;
      } else if (kind === "open") {
        status.textContent = `Opening ${id}…`;
        const d = await api("GET", docPath(id));
        fillDocForm(d);
        status.textContent = `Opened ${d.id} from ${d.collection}.`;
      } else if (kind === "delete") {
        status.textContent = `Deleting ${id}…`;
        const r = await api("DELETE", docPath(id));
        updateCount(r.collection, r.num_docs);
        status.textContent = `Deleted ${r.deleted} from ${r.collection}; ${r.num_docs} documents left.`;
      }
    } catch (err) {
      status.textContent = "";
      showError(errBox, err);
    }
  }

  // ------------------------------------------------------------------ API key
  function showKeyState() {
    $("key-state").textContent = apiKey() ? "Key set for this tab." : "No key set (kept for this tab only).";
  }

  // ------------------------------------------------------------------ wiring
  function init() {
    $("search-form").addEventListener("submit", (e) => { e.preventDefault(); runSearch(); });
    $("filter").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); $("search-form").requestSubmit(); }
    });
    $("filter").addEventListener("input", () => clearFieldError($("filter"), $("filter-error")));
    $("collection").addEventListener("change", fillRetrievers);
    $("method").addEventListener("change", syncMethod);
    $("retriever").addEventListener("change", () => { retrieverChosen = true; });

    $("doc-form").addEventListener("submit", (e) => { e.preventDefault(); docAction("save"); });
    $("doc-open").addEventListener("click", () => docAction("open"));
    $("doc-delete").addEventListener("click", () => docAction("delete"));

    $("key-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const value = $("api-key").value.trim();
      try {
        if (value) sessionStorage.setItem(KEY_STORAGE, value);
        else sessionStorage.removeItem(KEY_STORAGE);
      } catch (err) { /* storage disabled: the key is not kept */ }
      $("api-key").value = "";
      showKeyState();
      loadInfo();
    });
    $("key-forget").addEventListener("click", () => {
      try { sessionStorage.removeItem(KEY_STORAGE); } catch (err) { /* nothing kept */ }
      $("api-key").value = "";
      showKeyState();
    });

    const params = new URLSearchParams(location.search);
    if (params.get("q")) $("q").value = params.get("q");
    showKeyState();
    loadInfo();
    $("q").focus();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
