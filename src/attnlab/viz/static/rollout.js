// The Rollout view: attention rollout (Abnar & Zuidema 2020) of the sentence on show through layers
// 1..l: each layer's head mean mixed with the identity (the residual), rows renormalised, multiplied
// through the layers, so row i says how much of each input position reaches position i. Attention
// flow (the same graph read as maximum-flow problems) beside it, for short sentences. Read as the
// head view: rows the word that attends, columns where its rolled-out attention comes from; click a
// word (or a row of the map) for its row as bars.
// Data: the server's /api/rollout (one layer, any residual) or a page's embedded rollout (residual
// 0.5, every layer; flow through all layers), through the page's data source, as rollout(sentence,
// layer, residual, method) -> {labels, n, weights: Float32Array n*n, num_layers, flow_max_positions,
// flow_refusal, page: null or {residual, flow_layer}, unavailable: why this page cannot show it}; the
// view's layer (and page.flow_layer) is 1-based as shown, the API's and the embedded data's 0-based.
"use strict";
(function () {
  const AL = window.attnlab;
  const el = AL.el;
  const METHODS = {rollout: "attention rollout", flow: "attention flow"};
  const RESIDUALS = [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9];
  const {left: LEFT, top: TOP, scale: SCALE_W, bottom: BOTTOM} = AL.HEAT, MAX_PX = 480;
  const st = {maps: null, source: null, started: false, sentence: 0, layer: null, residual: 0.5, method: "rollout",
    pinned: null, data: null, error: null, ticket: 0, flowMax: null};

  // ---------------------------------------------------------------- the two data sources
  AL.ServerSource.prototype.rollout = function (sentence, layer, residual, method) {
    const key = `rollout/${method}/${sentence}/${layer}/${residual}`;
    if (!this.cache.has(key)) {
      const p = this.call("/api/rollout", {...this.request, sentence, layer: layer - 1, residual, method}).then((d) => ({
        ...d, n: d.labels.length, weights: Float32Array.from(d.weights.flat()), page: null,
      }));
      this.cache.set(key, p);
      p.catch(() => this.cache.delete(key));
    }
    return this.cache.get(key);
  };

  const unpack = (b64) => {
    const bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Uint16Array(bytes.buffer);
  };

  // A page holds the rollout of every layer at one residual, and flow through all layers only.
  AL.EmbeddedSource.prototype.rollout = function (sentence, layer, residual, method) {
    const r = this.data.rollout, s = r.sentences[sentence], n = s.positions;
    const labels = this.data.maps.sentences[sentence].labels;
    const page = {residual: r.residual, flow_layer: r.flow_layer + 1}; // the data's 0-based layer, as shown
    const base = {labels, n, num_layers: r.num_layers, flow_max_positions: r.flow_max_positions,
      flow_refusal: s.flow_refusal, page};
    if (residual !== r.residual) return Promise.resolve({...base, unavailable: `This page holds residual ${r.residual} only.`});
    if (method === "flow" && (!s.flow || layer !== page.flow_layer)) {
      return Promise.resolve({...base, unavailable: s.flow ? `This page holds attention flow through all ${page.flow_layer} ` +
        `layers only: choose layer ${page.flow_layer}, or run \`attnlab serve\` for flow at every layer.` : s.flow_refusal});
    }
    this.decoded = this.decoded || [];
    const key = `${method}/${sentence}`;
    if (!this.decoded[key]) this.decoded[key] = unpack(method === "flow" ? s.flow : s.rollout);
    const start = method === "flow" ? 0 : (layer - 1) * n * n;
    const raw = this.decoded[key].subarray(start, start + n * n);
    const weights = new Float32Array(n * n);
    for (let i = 0; i < raw.length; i++) weights[i] = raw[i] / 65535;
    return Promise.resolve({...base, weights});
  };

  // ---------------------------------------------------------------- the view
  const labels = () => st.maps.sentences[st.sentence].labels;
  const isMark = () => st.maps.sentences[st.sentence].is_mark;
  const numLayers = () => st.maps.model.num_layers;
  const weight = (i, j) => st.data.weights[i * st.data.n + j];
  const tooLongForFlow = () => st.flowMax !== null && labels().length > st.flowMax;

  function select(id, label, items, value, onchange, disabled) {
    const s = el("select", {id, disabled, onchange: (e) => onchange(e.target.value)},
      items.map(([v, text, off]) => el("option", {value: v, text, disabled: off, title: off || undefined})));
    s.value = String(value);
    return el("label", {}, `${label} `, s);
  }

  function controls() {
    const m = st.maps, d = st.data, page = d && d.page;
    const why = d && d.flow_refusal;
    const unit = m.level === "word" ? "words" : "tokens";
    return el("div", {class: "controls"},
      m.sentences.length > 1 ? select("rollout-sentence", "Sentence", m.sentences.map((s, i) => [i, `${i + 1}: ${s.text}`]),
        st.sentence, (v) => { st.sentence = Number(v); st.pinned = null; if (tooLongForFlow()) st.method = "rollout"; load(); }) : null,
      select("rollout-method", "Show", Object.entries(METHODS).map(([k, t]) => [k, t, k === "flow" && why ? why : false]),
        st.method, (v) => { st.method = v; load(); }),
      select("rollout-layer", "Through layer", Array.from({length: numLayers()}, (_, l) => [l + 1, `1–${l + 1}`]),
        st.layer, (v) => { st.layer = Number(v); load(); }),
      select("rollout-residual", "Residual", (page ? [page.residual] : RESIDUALS).map((r) => [r, r.toFixed(1)]),
        st.residual, (v) => { st.residual = Number(v); load(); }, !!page),
      el("span", {class: "muted", text: `${m.level} level · ${labels().length} ${unit}`}));
  }

  function notes() {
    const d = st.data, out = [];
    if (d && d.flow_refusal) out.push(el("p", {id: "rollout-flow-note", class: "muted", text: `No attention flow here: ${d.flow_refusal}.`}));
    if (d && d.page) {
      out.push(el("p", {id: "rollout-page-note", class: "muted", text: `This page holds residual ${d.page.residual} only` +
        ` (and flow through all ${d.page.flow_layer} layers); \`attnlab serve\` computes any residual, and flow at every layer.`}));
    }
    if (st.maps.seq2seq) out.push(el("p", {class: "muted", text: "An encoder–decoder: the rollout of its encoder's self-attention."}));
    return out;
  }

  // Labels along both axes and the colour scale (AL.heatFrame); the pinned row's label in red.
  const axes = (canvas, n, px) => AL.heatFrame(canvas, labels(), labels(), px / n, (i) => (i === st.pinned ? "#c0392b" : "#333"));

  function heat() {
    const n = st.data.n, px = Math.min(MAX_PX, Math.max(240, n * 16)), cell = px / n;
    const at = `left:${LEFT}px;top:${TOP}px`;
    const axesCanvas = el("canvas", {id: "rollout-heat-axes", class: "axes"});
    const SH = axes(axesCanvas, n, px);
    const image = el("canvas", {id: "rollout-heat", class: "matrix", style: at});
    AL.drawMatrix(image, st.data.weights, n, px);
    const mark = el("canvas", {class: "overlay", style: at});
    const ctx = AL.fitCanvas(mark, px, px);
    if (st.pinned !== null) {
      ctx.strokeStyle = "#c0392b"; ctx.lineWidth = 2;
      ctx.strokeRect(0, st.pinned * cell, px, Math.max(2, cell));
    }
    const tip = el("p", {id: "rollout-tip", class: "muted",
      text: "rows: the word that attends, columns: where its rolled-out attention comes from (the input word)"});
    const cellAt = (e) => {
      const r = mark.getBoundingClientRect();
      return [Math.floor((e.clientY - r.top) / cell), Math.floor((e.clientX - r.left) / cell)];
    };
    mark.addEventListener("mousemove", (e) => {
      const [i, j] = cellAt(e);
      if (i >= 0 && i < n && j >= 0 && j < n) tip.textContent = `"${labels()[i]}" ← "${labels()[j]}": ${AL.pct1(weight(i, j))}`;
    });
    mark.addEventListener("click", (e) => { const i = cellAt(e)[0]; if (i >= 0 && i < n) choose(i); });
    return el("div", {}, el("div", {class: "stack", style: `width:${LEFT + px + SCALE_W}px;height:${TOP + SH + BOTTOM}px`},
      axesCanvas, image, mark), tip);
  }

  // The chosen row as bars, in sentence order: where this position's input comes from.
  function rowBars() {
    const q = st.pinned;
    if (q === null || !st.data || !st.data.weights) {
      return el("aside", {id: "rollout-side"}, el("p", {class: "muted", text: "Click a word, or a row of the map."}));
    }
    return el("aside", {id: "rollout-side"},
      el("h3", {id: "rollout-query", text: `"${labels()[q]}" draws on`}),
      el("div", {style: `max-height:${MAX_PX}px;overflow-y:auto`}, el("table", {id: "rollout-row", class: "row"},
        el("tbody", {}, labels().map((w, j) => el("tr", {"data-index": j, class: j === q ? "query" : ""},
          el("td", {class: isMark()[j] ? "muted" : "", text: w}),
          el("td", {class: "bar"}, el("span", {class: "fill", style: `width:${(100 * weight(q, j)).toFixed(1)}%`})),
          el("td", {class: "num pct", text: AL.pct1(weight(q, j))})))))));
  }

  function strip() {
    const q = st.pinned, ok = st.data && st.data.weights;
    return el("div", {id: "rollout-words", class: "strip"}, labels().map((w, j) => {
      const v = q !== null && ok ? weight(q, j) : 0;
      return el("span", {class: `word${isMark()[j] ? " mark" : ""}${j === q ? " chosen" : ""}`, "data-index": j, text: w,
        style: q !== null && ok ? `background:${AL.heat(v)};${v > 0.45 ? "color:#fff" : ""}` : undefined, onclick: () => choose(j)});
    }));
  }

  function render() {
    const root = document.getElementById("view-rollout");
    if (!st.maps) { root.replaceChildren(el("p", {class: "muted", text: "No sentence yet: type one above and press Show attention."})); return; }
    const d = st.data;
    const what = `${st.maps.model.id}: ${METHODS[st.method]} through layers 1–${st.layer} of ${numLayers()}, residual ${st.residual.toFixed(1)}`;
    let body;
    if (st.error) body = el("p", {id: "rollout-error", class: "status error", text: st.error});
    else if (!d) body = el("p", {class: "muted", text: st.method === "flow" ? "computing attention flow (maximum flow: it takes a few seconds)…" : "loading…"});
    else if (d.unavailable) body = el("p", {id: "rollout-unavailable", class: "lead", text: d.unavailable});
    else body = el("div", {class: "head-body"}, el("div", {class: "head-main"}, heat()), rowBars());
    root.replaceChildren(controls(), ...notes(), el("p", {id: "rollout-caption", class: "lead", text: what}), strip(), body);
  }

  function choose(j) { st.pinned = j; render(); }

  async function load() {
    if (!st.maps || !st.source) { render(); return; }
    const ticket = ++st.ticket;
    st.sentence = Math.min(st.sentence, st.maps.sentences.length - 1);
    st.layer = st.layer === null ? numLayers() : Math.min(st.layer, numLayers());
    st.data = null;
    st.error = null;
    render();
    try {
      const d = await st.source.rollout(st.sentence, st.layer, st.residual, st.method);
      if (ticket !== st.ticket) return; // a later choice won
      st.data = d;
      st.flowMax = d.flow_max_positions;
      if (d.page) st.residual = d.page.residual;
    } catch (e) {
      if (ticket !== st.ticket) return;
      st.error = e.message;
    }
    render();
  }

  AL.on("maps", ({maps, source}) => {
    Object.assign(st, {maps, source, sentence: 0, pinned: null});
    if (st.method === "flow" && tooLongForFlow()) st.method = "rollout";
    if (st.started) load();
  });

  AL.rollout = {
    show(source) {
      st.source = st.source || source;
      st.started = true;
      load();
    },
    current: () => (st.data && st.data.weights ? {layer: st.layer, residual: st.residual, method: st.method,
      n: st.data.n, weights: Array.from(st.data.weights)} : null),
  };
})();
