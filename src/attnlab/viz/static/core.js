// attnlab viewer, shared pieces: DOM helpers, colours, number formats, and the two data sources
// (the local server's JSON API, or the data embedded in a self-contained page). No network beyond
// the page's own origin, no libraries.
"use strict";
const AL = (window.attnlab = window.attnlab || {});

AL.el = function (tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c);
  return node;
};

// A weight as `attnlab scene` prints it (0.598 -> "60 %") and with one decimal for the maps.
AL.pct = (x) => `${Math.round(100 * x)} %`;
AL.pct1 = (x) => `${(100 * x).toFixed(1)} %`;
AL.num = (x, digits = 2) => x.toFixed(digits);
// A model's attentions (attnlab.viz.payload.ATTENTIONS) as the views name them.
AL.ATTENTIONS = {encoder: "encoder self-attention", decoder: "decoder self-attention",
  cross: "cross-attention (target → source)"};

// Weight in [0, 1] -> colour on a white-to-blue ramp (sqrt, so that small weights still show).
AL.heatRGB = function (w) {
  const t = Math.sqrt(Math.max(0, Math.min(1, w)));
  return [Math.round(255 - 225 * t), Math.round(255 - 160 * t), Math.round(255 - 20 * t)];
};
AL.heat = (w) => `rgb(${AL.heatRGB(w).join(",")})`;

// A signed value in [-1, 1] -> colour on a red-white-blue ramp, linear in |x|: 0 white, 1 the
// viewer's blue (#2c6fbb), -1 its red (#c0392b), as the patching heat maps (red below 0, blue above).
AL.SIGNED_ENDS = {below: [192, 57, 43], above: [44, 111, 187]};
AL.signedRGB = function (x) {
  const t = Math.max(-1, Math.min(1, x));
  const end = t < 0 ? AL.SIGNED_ENDS.below : AL.SIGNED_ENDS.above;
  return end.map((c) => Math.round(255 + (c - 255) * Math.abs(t)));
};
AL.signed = (x) => `rgb(${AL.signedRGB(x).join(",")})`;

// Draw an n x n map (Float32Array or array, row-major) into a canvas of `px` pixels a side.
// An n x m map (rows x columns, m = n when left out) is drawn with square cells, its longer side px.
AL.drawMatrix = function (canvas, data, n, px, m = n) {
  canvas.width = m;
  canvas.height = n;
  canvas.style.width = `${(px * m) / Math.max(n, m)}px`;
  canvas.style.height = `${(px * n) / Math.max(n, m)}px`;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(m, n);
  for (let i = 0; i < n * m; i++) {
    const [r, g, b] = AL.heatRGB(data[i]);
    img.data[4 * i] = r;
    img.data[4 * i + 1] = g;
    img.data[4 * i + 2] = b;
    img.data[4 * i + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
};

// The frame of a labelled heat map (head view, rollout): the map's rows x columns of square cells
// of `cell` px sit at (AL.HEAT.left, AL.HEAT.top) of `canvas`; the labels go along both axes (every
// k-th where rows are thinner than the text; `rowColour(i)` colours row i's label) and the colour
// scale beside the map (the same ramp, 0 % at the bottom to 100 % at the top). Returns the scale's height.
// `rowCell`: the rows' height where it differs from the columns' width (cells `cell` wide, `rowCell` high).
AL.HEAT = {left: 96, top: 84, scale: 64, bottom: 10};
AL.heatFrame = function (canvas, rowLabels, colLabels, cell, rowColour = () => "#333", rowCell = cell) {
  const {left, top, scale, bottom} = AL.HEAT;
  const W = colLabels.length * cell, SH = Math.max(rowLabels.length * rowCell, 120);
  const ctx = AL.fitCanvas(canvas, left + W + scale, top + SH + bottom);
  const step = Math.max(1, Math.ceil(12 / cell)), rowStep = Math.max(1, Math.ceil(12 / rowCell));
  const fit = (t) => (t.length > 12 ? `${t.slice(0, 11)}…` : t);
  ctx.font = "11px sans-serif";
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  for (let i = 0; i < rowLabels.length; i += rowStep) {
    ctx.fillStyle = rowColour(i);
    ctx.fillText(fit(rowLabels[i]), left - 4, top + (i + 0.5) * rowCell);
  }
  ctx.fillStyle = "#333";
  ctx.textAlign = "left";
  for (let j = 0; j < colLabels.length; j += step) {
    ctx.save();
    ctx.translate(left + (j + 0.5) * cell, top - 4);
    ctx.rotate(-Math.PI / 3);
    ctx.fillText(fit(colLabels[j]), 0, 0);
    ctx.restore();
  }
  const x0 = left + W + 12, bar = 12;
  for (let y = 0; y < SH; y++) {
    ctx.fillStyle = AL.heat(1 - y / (SH - 1));
    ctx.fillRect(x0, top + y, bar, 1);
  }
  ctx.strokeStyle = "#999";
  ctx.strokeRect(x0, top, bar, SH);
  ctx.fillStyle = "#333";
  for (const v of [0, 0.25, 0.5, 0.75, 1]) ctx.fillText(`${Math.round(100 * v)} %`, x0 + bar + 4, top + (1 - v) * (SH - 1));
  return SH;
};

// Canvas backing store at the screen's pixel density.
AL.fitCanvas = function (canvas, w, h) {
  const r = window.devicePixelRatio || 1;
  canvas.width = Math.round(w * r);
  canvas.height = Math.round(h * r);
  canvas.style.width = `${w}px`;
  canvas.style.height = `${h}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(r, 0, 0, r, 0, 0);
  return ctx;
};

AL.status = function (text, isError) {
  const s = document.getElementById("status");
  if (!s) return;
  s.textContent = text;
  s.classList.toggle("error", !!isError);
};

// ---------------------------------------------------------------- data sources
// Both sources answer the same questions with the same shapes:
//   maps()              -> the /api/maps answer (labels, marks, downsampled maps, role scores)
// The views number layers and heads as people read them (1-based: the selects, the captions); the
// sources take those numbers and convert at their edge, since the API's fields and the embedded
// data are 0-based (as every field of attnlab: docs/design.md, "Layers and heads").
//   head(s, layer, hd, attention) -> {n, rows, cols, weights: Float32Array rows*cols, sink: Float32Array rows
//                          (learned sinks: each row's share of the sink) or null} for sentence s,
//                          layer and head as shown (1-based); attention "encoder" (the default: the maps' own, rows =
//                          cols = n), or an encoder–decoder's "decoder" or "cross" (target rows,
//                          source columns), which the maps announce in their `seq2seq` part
//   scene()             -> the /api/scene answer (the lesson's scene, as `attnlab scene --json`)
//   findHead(req)       -> the /api/find-head answer
//   patch(req), attribute(req) (served only) -> the /api/patch and /api/attribute answers: {model, metric,
//                          heads: [L][H] (0-based), ...}: what the model view colours its heads by
//   generate(req) (served) / generation() (a page) -> the /api/generate answer: {model, labels,
//                          prompt_length, prompt, text, steps: [{step, position, token, rows: [L][H][position + 1]}]}
//   neuronInfo()        -> what the Neuron view can show, at once: {sentences: [{text}], attentions: {encoder:
//                          {num_layers, num_heads}, and for an encoder–decoder decoder and cross}}, or
//                          null (no sentences on show, or a page without queries and keys)
//   neuron(s, layer, hd, attention) -> one head's queries and keys, the /api/neuron answer: {labels,
//                          key_labels, q: [Tq][D], k: [Tk][D], bias: [Tq][Tk] or null, meta: {scale,
//                          softcap, causal, window}}; or {too_long, length, max_tokens} where a page
//                          left a long sentence's out

class ServerSource {
  constructor() {
    this.request = null; // {sentences, level} of the maps on show
    this.cache = new Map();
  }
  async call(path, body) {
    const init = body === undefined ? {} : {
      method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
    };
    const res = await fetch(path, init);
    const data = await res.json().catch(() => ({detail: res.statusText}));
    if (!res.ok) {
      const d = data.detail;
      // The server words each problem as a sentence (a 422 lists them); a 503 says when to retry.
      const msg = Array.isArray(d) ? d.map((e) => e.msg).join(" ") : d;
      throw new Error(msg || `The server answered ${res.status} ${res.statusText}.`);
    }
    return data;
  }
  info() { return this.call("/api/info"); }
  scene() { return this.call("/api/scene"); }
  async maps(sentences, level) {
    const data = await this.call("/api/maps", {sentences, level});
    this.request = {sentences, level};
    this.shown = data;
    this.cache.clear();
    return data;
  }
  neuronInfo() {
    const m = this.shown;
    if (!m) return null;
    const attentions = {encoder: m.model};
    if (m.seq2seq) attentions.decoder = attentions.cross = m.seq2seq.model; // /api/neuron serves their tokens' q and k
    return {sentences: m.sentences.map((s) => ({text: s.text})), attentions};
  }
  neuron(sentence, layer, head, attention = "encoder") {
    const key = `neuron/${attention}/${sentence}/${layer}/${head}`;
    if (!this.cache.has(key)) {
      const p = this.call("/api/neuron", {sentences: this.request.sentences, sentence, layer: layer - 1, head: head - 1, attention});
      this.cache.set(key, p);
      p.catch(() => this.cache.delete(key));
    }
    return this.cache.get(key);
  }
  async head(sentence, layer, head, attention = "encoder") {
    const key = `${attention}/${sentence}/${layer}/${head}`;
    if (!this.cache.has(key)) {
      const p = this.call("/api/head", {...this.request, sentence, layer: layer - 1, head: head - 1, attention}).then((d) => ({
        n: d.labels.length, rows: d.labels.length, cols: d.key_labels.length, weights: Float32Array.from(d.weights.flat()),
        sink: d.sink_share ? Float32Array.from(d.sink_share) : null,
      }));
      this.cache.set(key, p);
      p.catch(() => this.cache.delete(key));
    }
    return this.cache.get(key);
  }
  findHead(req) { return this.call("/api/find-head", req); }
  generate(req) { return this.call("/api/generate", req); }
  patch(req) { return this.call("/api/patch", req); }
  attribute(req) { return this.call("/api/attribute", req); }
}

// The embedded data of a self-contained page: every head of every sentence, packed as uint16
// (weight * 65535, base64, little-endian), decoded on first use.
class EmbeddedSource {
  constructor(data) {
    this.data = data;
    this.decoded = [];
  }
  info() { return Promise.resolve(this.data.maps ? this.data.maps.model : null); }
  scene() { return Promise.resolve(this.data.scene); }
  maps() { return Promise.resolve(this.data.maps); }
  // attention: "encoder" (the maps' own), or on an encoder–decoder's page "decoder" (its self-attention
  // over the target) or "cross" (target rows, source columns).
  // One packed array ([L, H, ...] as uint16), decoded once and kept under `key`; the `size` values of head
  // (layer, head), 1-based, as floats in [0, 1].
  unpack(key, packed, layer, head, heads, size) {
    if (!this.decoded[key]) {
      const bin = atob(packed);
      const bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      this.decoded[key] = new Uint16Array(bytes.buffer);
    }
    const start = ((layer - 1) * heads + (head - 1)) * size;
    const raw = this.decoded[key].subarray(start, start + size);
    const out = new Float32Array(size);
    for (let i = 0; i < raw.length; i++) out[i] = raw[i] / 65535;
    return out;
  }
  head(sentence, layer, head, attention = "encoder") {
    const m = this.data.maps;
    const s = m.sentences[sentence];
    const seq = attention === "encoder" ? null : m.seq2seq.sentences[sentence];
    const rows = seq ? seq.target.length : s.labels.length;
    const cols = attention === "cross" ? seq.source.length : rows;
    const heads = seq ? m.seq2seq.model.num_heads : m.model.num_heads;
    const weights = this.unpack(`${attention}/${sentence}`, seq ? seq[attention] : m.packed[sentence], layer, head, heads, rows * cols);
    // learned sinks: each row's share of the sink, [L, H, T] per sentence, packed as the weights
    const sink = !seq && m.sink_share ? this.unpack(`sink/${sentence}`, m.sink_share[sentence], layer, head, heads, rows) : null;
    return Promise.resolve({n: rows, rows, cols, weights, sink});
  }
  findHead() { return Promise.resolve(this.data.search); }
  generation() { return Promise.resolve(this.data.generation); }
  // The Neuron data: the maps' own attention at the top level, an encoder–decoder's "decoder" and
  // "cross" beside it, each {model, meta (per layer), sentences: [{labels, key_labels, q, k, bias}]}.
  neuronInfo() {
    const n = this.data.neuron;
    if (!n) return null;
    const attentions = {encoder: n.model};
    for (const k of ["decoder", "cross"]) if (n[k]) attentions[k] = n[k].model;
    return {sentences: n.sentences.map((s) => ({text: s.text})), attentions};
  }
  neuron(sentence, layer, head, attention = "encoder") {
    const n = this.data.neuron, part = attention === "encoder" ? n : n[attention];
    const s = part.sentences[sentence], L = layer - 1, H = head - 1;
    if (!s.q) return Promise.resolve({too_long: true, length: s.labels.length, max_tokens: n.max_tokens});
    const meta = {};
    for (const name of ["scale", "softcap", "causal", "window"]) meta[name] = part.meta[name][L];
    if (part.meta.sink_logits && part.meta.sink_logits[L]) meta.sink_logits = part.meta.sink_logits[L]; // learned sinks
    return Promise.resolve({labels: s.labels, key_labels: s.key_labels || s.labels, q: s.q[L][H], k: s.k[L][H],
      bias: s.bias ? s.bias[L][H] : null, meta});
  }
}

AL.ServerSource = ServerSource;
AL.EmbeddedSource = EmbeddedSource;

// A tiny event hub: views listen for new maps and for the head or word chosen elsewhere.
AL.listeners = {};
AL.on = (name, fn) => (AL.listeners[name] = AL.listeners[name] || []).push(fn);
AL.emit = (name, arg) => (AL.listeners[name] || []).forEach((fn) => fn(arg));
