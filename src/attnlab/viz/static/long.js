// attnlab long view: every head's pooled overview, one head's overview large, an exact tile, a query's
// row (top keys and the whole row as a strip), its column, and a reading view shaded by them. Served
// (attnlab serve, /long) every weight comes from /api/long/*, computed on request; a self-contained
// page embeds every overview and every row's top keys (float16), and says what needs the server.
"use strict";
(function () {
const AL = window.attnlab;
const $ = (id) => document.getElementById(id);
const LONG = (AL.long = {shown: {}});

function bytesOf(b64) {
  const bin = atob(b64), out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out.buffer;
}
const f32 = (b64) => new Float32Array(bytesOf(b64));
function f16(b64) { // IEEE half floats -> Float32Array
  const h = new Uint16Array(bytesOf(b64)), out = new Float32Array(h.length);
  for (let i = 0; i < h.length; i++) {
    const e = (h[i] >> 10) & 31, f = h[i] & 1023, s = h[i] & 32768 ? -1 : 1;
    out[i] = e === 0 ? s * f * 2 ** -24 : e === 31 ? (f ? NaN : s * Infinity) : s * (1 + f / 1024) * 2 ** (e - 15);
  }
  return out;
}
// Tokens as text: byte-level BPE's space and newline marks, SentencePiece's space.
const readable = (t) => t.replace(/Ġ|▁/g, " ").replace(/Ċ/g, "\n");

// Both sources answer with 0-based layers, heads and positions, as the API.
class LongServer {
  constructor(text) { this.text = text; this.api = new AL.ServerSource(); }
  call(path, body) { return this.api.call(`/api/long/${path}`, {text: this.text, ...body}); }
  info() { return this.call("info", {}); }
  async overview(layer, head, cells) {
    const d = await this.call("overview", {layer, head, cells});
    return {cells: d.cells, block: d.block, mean: f32(d.mean), max: f32(d.max)};
  }
  async tile(layer, head, rows, cols) {
    const d = await this.call("tile", {layer, head, rows, cols});
    return f32(d.weights);
  }
  async row(layer, head, query, top) {
    const d = await this.call("row", {layer, head, query, top});
    return {weights: f32(d.weights), top: d.top, sinkShare: d.sink_share};
  }
  async column(layer, head, key) { return f32((await this.call("column", {layer, head, key})).weights); }
}

class LongEmbedded {
  constructor(data) { this.data = data; this.cache = new Map(); }
  info() { return Promise.resolve(this.data); }
  part(layer, head) {
    const k = `${layer}/${head}`;
    if (!this.cache.has(k)) {
      const p = this.data.heads[layer][head];
      this.cache.set(k, {mean: f16(p.mean), max: f16(p.max), keys: new Uint16Array(bytesOf(p.keys)), weights: f16(p.weights)});
    }
    return this.cache.get(k);
  }
  overview(layer, head) {
    const p = this.part(layer, head);
    return Promise.resolve({cells: this.data.cells, block: this.data.block, mean: p.mean, max: p.max});
  }
  tile() { return Promise.reject(new Error("Exact tiles need every weight: serve the text (attnlab serve, then /long) to zoom in. This page keeps the overviews and each query's top keys.")); }
  row(layer, head, query, top) {
    const p = this.part(layer, head), k = this.data.top, out = [];
    for (let r = 0; r < Math.min(top, k); r++) {
      const key = p.keys[query * k + r];
      out.push({key, token: this.data.tokens[key], weight: p.weights[query * k + r]});
    }
    return Promise.resolve({weights: null, top: out});
  }
  column() { return Promise.reject(new Error("A column needs every row's weights: serve the text (attnlab serve, then /long).")); }
}

const state = {src: null, info: null, layer: 0, head: 0, kind: "max", query: null, zoom: null, ov: null};

function heatCanvas(canvas, values, rows, cols, vmax) {
  canvas.width = cols;
  canvas.height = rows;
  const ctx = canvas.getContext("2d"), img = ctx.createImageData(cols, rows);
  for (let i = 0; i < rows * cols; i++) {
    const [r, g, b] = AL.heatRGB(vmax > 0 ? values[i] / vmax : 0);
    img.data.set([r, g, b, 255], 4 * i);
  }
  ctx.putImageData(img, 0, 0);
}
const maxOf = (xs) => xs.reduce((m, x) => (x > m ? x : m), 0);
// The overview's colour scale: its 99th percentile of the non-zero cells, not its largest (a long map's
// first rows weigh 100 % on a few keys and would leave every other cell white).
function scaleOf(xs) {
  const pos = Array.from(xs).filter((x) => x > 0).sort((a, b) => a - b);
  return pos.length ? pos[Math.floor(0.99 * (pos.length - 1))] : 0;
}
// A weight as a percentage to three significant digits: 0.0031 % reads where 0.0 % would say nothing.
const pct3 = (x) => `${(100 * x).toPrecision(3)} %`;

async function drawOverview() {
  const {layer, head} = state;
  const ov = await state.src.overview(layer, head, 512);
  if (layer !== state.layer || head !== state.head) return;
  state.ov = ov;
  const values = ov[state.kind], vmax = scaleOf(values);
  heatCanvas($("long-overview"), values, ov.cells, ov.cells, vmax);
  LONG.shown.overview = {layer, head, kind: state.kind, cells: ov.cells, block: ov.block, values, vmax};
  $("long-overview-caption").textContent = `layer ${layer + 1}, head ${head + 1}: ${ov.cells} × ${ov.cells} cells of ` +
    `${ov.block} × ${ov.block} weights, each the ${state.kind === "max" ? "largest" : "mean"} weight of its block ` +
    `(darkest at ${pct3(vmax)} and above, 99 % of the cells below it; the largest is ${pct3(maxOf(values))}). ` +
    "Click or drag to see a region exactly.";
}

async function drawZoom() {
  const z = state.zoom, box = $("long-zoom");
  box.replaceChildren();
  if (!z) return;
  const {layer, head} = state;
  try {
    const w = await state.src.tile(layer, head, z.rows, z.cols);
    const nr = z.rows[1] - z.rows[0], nc = z.cols[1] - z.cols[0], toks = state.info.tokens;
    LONG.shown.tile = {layer, head, rows: z.rows, cols: z.cols, weights: w};
    const canvas = AL.el("canvas", {class: "axes"});
    if (nr <= 64 && nc <= 64) { // single tokens: labels and 0-100 % colours, as the head view
      const cell = Math.max(8, Math.floor(448 / Math.max(nr, nc)));
      AL.heatFrame(canvas, toks.slice(z.rows[0], z.rows[1]).map(readable), toks.slice(z.cols[0], z.cols[1]).map(readable), cell);
      const ctx = canvas.getContext("2d");
      for (let i = 0; i < nr; i++) for (let j = 0; j < nc; j++) {
        ctx.fillStyle = AL.heat(w[i * nc + j]);
        ctx.fillRect(AL.HEAT.left + j * cell, AL.HEAT.top + i * cell, cell, cell);
      }
      canvas.style.position = "static";
      canvas.addEventListener("click", (e) => {
        const r = Math.floor((e.offsetY - AL.HEAT.top) / cell);
        if (r >= 0 && r < nr) selectQuery(z.rows[0] + r);
      });
    } else {
      heatCanvas(canvas, w, nr, nc, maxOf(w));
      canvas.className = "long-overview";
      canvas.style.position = "static";
    }
    box.append(canvas);
    $("long-zoom-caption").textContent = `queries ${z.rows[0] + 1}–${z.rows[1]} × keys ${z.cols[0] + 1}–${z.cols[1]}, ` +
      "every weight exact (computed from the queries, keys and each row's log-sum-exp).";
  } catch (e) {
    $("long-zoom-caption").textContent = e.message;
  }
}

async function drawRow() {
  const q = state.query;
  if (q === null) return;
  const {layer, head} = state, toks = state.info.tokens;
  try {
    const row = await state.src.row(layer, head, q, 10);
    LONG.shown.row = {layer, head, query: q, top: row.top, weights: row.weights};
    const sink = row.sinkShare == null ? "" : ` (the learned sink takes ${pct3(row.sinkShare)} of its attention)`;
    $("long-row-title").textContent = `Query ${q + 1} (${JSON.stringify(readable(toks[q]))}), layer ${layer + 1}, head ${head + 1}: its top keys${sink}`;
    $("long-top").replaceChildren(...row.top.map((t) => AL.el("tr", {class: "top-key", "data-key": t.key},
      AL.el("td", {class: "num", text: `${t.key + 1}`}), AL.el("td", {text: JSON.stringify(readable(t.token))}),
      AL.el("td", {class: "num weight", text: pct3(t.weight)}))));
    const strip = $("long-row-strip"), T = toks.length;
    const full = row.weights || (() => { const w = new Float32Array(T); row.top.forEach((t) => (w[t.key] = t.weight)); return w; })();
    heatCanvas(strip, full, 1, T, maxOf(full));
    if ($("long-shade").value === "row") shade(full);
    else drawColumn();
  } catch (e) {
    AL.status(e.message, true);
  }
}

async function drawColumn() {
  try {
    const col = await state.src.column(state.layer, state.head, state.query);
    LONG.shown.column = {layer: state.layer, head: state.head, key: state.query, weights: col};
    shade(col);
  } catch (e) {
    AL.status(e.message, true);
  }
}

function shade(values) { // the reading view: each token's background by its value, scaled to the largest
  const vmax = maxOf(values), spans = $("long-read").children;
  LONG.shown.shade = {values, vmax};
  for (let i = 0; i < spans.length; i++) spans[i].style.background = values[i] > 0 ? AL.heat(values[i] / vmax) : "";
}

function selectQuery(q) {
  const spans = $("long-read").children;
  if (state.query !== null && spans[state.query]) spans[state.query].classList.remove("chosen");
  state.query = q;
  $("long-query").value = q + 1;
  spans[q].classList.add("chosen");
  drawRow();
}

function zoomTo(r0, r1, c0, c1) { // overview cells -> token ranges, at most the server's tile
  const b = state.ov.block, T = state.info.num_tokens, most = state.info.max_tile || 512;
  const span = (a, z) => {
    let s = a * b, e = Math.min(T, (z + 1) * b);
    if (e - s < 32) { const mid = (s + e) >> 1; s = Math.max(0, mid - 16); e = Math.min(T, s + 32); }
    return [s, Math.min(e, s + most)];
  };
  state.zoom = {rows: span(Math.min(r0, r1), Math.max(r0, r1)), cols: span(Math.min(c0, c1), Math.max(c0, c1))};
  drawZoom();
}

function wireOverview() {
  const c = $("long-overview");
  let from = null;
  const cellAt = (e) => {
    const n = state.ov.cells, r = c.getBoundingClientRect();
    return [Math.min(n - 1, Math.floor(((e.clientY - r.top) / r.height) * n)), Math.min(n - 1, Math.floor(((e.clientX - r.left) / r.width) * n))];
  };
  c.addEventListener("mousedown", (e) => { if (state.ov) from = cellAt(e); });
  c.addEventListener("mouseup", (e) => {
    if (!from) return;
    const to = cellAt(e);
    zoomTo(from[0], to[0], from[1], to[1]);
    from = null;
  });
}

function showHead() {
  $("long-layer").value = state.layer;
  $("long-head").value = state.head;
  drawOverview();
  drawZoom();
  drawRow();
}

async function drawGrid() {
  const {num_layers: L, num_heads: H} = state.info.model, grid = $("long-grid");
  grid.style.gridTemplateColumns = `max-content repeat(${H}, 76px)`;
  grid.replaceChildren(AL.el("span"), ...Array.from({length: H}, (_, h) => AL.el("span", {class: "axis", text: `head ${h + 1}`})));
  for (let l = 0; l < L; l++) {
    grid.append(AL.el("span", {class: "axis", text: `layer ${l + 1}`}));
    for (let h = 0; h < H; h++) {
      const canvas = AL.el("canvas", {"data-layer": l, "data-head": h});
      grid.append(AL.el("button", {class: "cell", title: `layer ${l + 1}, head ${h + 1}`, type: "button",
        onclick: () => { state.layer = l; state.head = h; showHead(); }}, canvas));
    }
  }
  const fill = async () => {
    for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) { // one at a time: the server computes each on request
      const ov = await state.src.overview(l, h, state.src instanceof LongServer ? 128 : 512);
      heatCanvas(grid.querySelector(`canvas[data-layer="${l}"][data-head="${h}"]`), ov.max, ov.cells, ov.cells, scaleOf(ov.max));
    }
  };
  // Served, each overview is a pass over the head's whole map (a minute at 32,768 tokens on a small CPU),
  // and the server's workers are shared with the rows and tiles asked for: past GRID_AUTO tokens the grid
  // waits to be asked.
  if (state.src instanceof LongServer && state.info.num_tokens > GRID_AUTO) {
    const go = AL.el("button", {type: "button", text: `Compute every head's overview (${L * H} passes over ` +
      `${state.info.num_tokens} × ${state.info.num_tokens})`, onclick: () => { go.remove(); fill(); }});
    grid.before(go);
    return;
  }
  await fill();
}
const GRID_AUTO = 4096;

async function start(src) {
  state.src = src;
  AL.status("computing…");
  try {
    state.info = await src.info();
  } catch (e) {
    AL.status(e.message, true);
    return;
  }
  const info = state.info, m = info.model, MB = (x) => `${(x / 1e6).toFixed(1)} MB`;
  $("model-id").textContent = `${m.id}: ${m.num_layers} layers × ${m.num_heads} heads`;
  $("long-size").textContent = `${info.num_tokens} tokens. Held: ${MB(info.held_bytes)} of queries, keys and each ` +
    `row's log-sum-exp; the full map would be ${MB(info.full_bytes)} of weights.`;
  $("long-layer").replaceChildren(...Array.from({length: m.num_layers}, (_, l) => AL.el("option", {value: l, text: `${l + 1}`})));
  $("long-head").replaceChildren(...Array.from({length: m.num_heads}, (_, h) => AL.el("option", {value: h, text: `${h + 1}`})));
  $("long-query").max = info.num_tokens;
  $("long-read").replaceChildren(...info.tokens.map((t, i) => AL.el("span", {"data-i": i, onclick: () => selectQuery(i)}, readable(t))));
  $("long").hidden = false;
  state.query = info.num_tokens - 1;
  showHead();
  selectQuery(state.query);
  await drawGrid();
  AL.status("");
}

function wire() {
  const step = (d) => {
    const H = state.info.model.num_heads, n = state.info.model.num_layers * H;
    const k = (state.layer * H + state.head + d + n) % n;
    state.layer = Math.floor(k / H);
    state.head = k % H;
    showHead();
  };
  $("long-layer").addEventListener("change", (e) => { state.layer = +e.target.value; showHead(); });
  $("long-head").addEventListener("change", (e) => { state.head = +e.target.value; showHead(); });
  $("long-prev").addEventListener("click", () => step(-1));
  $("long-next").addEventListener("click", () => step(1));
  $("long-kind").addEventListener("change", (e) => { state.kind = e.target.value; drawOverview(); });
  $("long-shade").addEventListener("change", () => drawRow());
  $("long-query").addEventListener("change", (e) => {
    const q = +e.target.value - 1;
    if (q >= 0 && q < state.info.num_tokens) selectQuery(q);
  });
  wireOverview();
}

window.addEventListener("DOMContentLoaded", () => {
  wire();
  const embedded = document.getElementById("attnlab-data");
  if (embedded) return start(new LongEmbedded(JSON.parse(embedded.textContent)));
  $("input").hidden = false;
  $("input").addEventListener("submit", (e) => {
    e.preventDefault();
    start(new LongServer($("long-text").value));
  });
});
})();
