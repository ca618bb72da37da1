// The Head view: one head of one layer (numbered 1-based, as people read them; the data sources
// send the API 0-based). Hover or click a word to
// see its row of weights: as lines from the word to every word (bertviz's picture), or as heat
// over the whole map; the sentence strip is coloured by the same row, and a list gives the
// largest weights as numbers. Long inputs stay fast: the lines are drawn on a canvas for the rows
// on screen only, and the heat map is one image of n x n pixels.
// An encoder–decoder's page also holds the decoder's self-attention and the cross-attention: a
// choice of "encoder / decoder / cross" shows them, cross with the target tokens (the queries) on
// the left and the source tokens (the keys) on the right, as bertviz draws it.
// A model with learned sinks (gpt-oss) gives rows that add up to less than 1: a "sink" chip after the
// sentence takes the chosen row's sink share as its colour, and the list says the share as a number.
"use strict";
(function () {
  const AL = window.attnlab;
  const el = AL.el;
  const ROW = 20; // px per word in the lines display
  const MAX_VIEW_H = 480; // px of the scrolling lines display, at most
  const TOP_K = 10;
  const st = {maps: null, source: null, sentence: 0, layer: 1, head: 1, attention: "encoder", pinned: null, hover: null,
    display: "lines", map: null, ticket: 0, drawn: [], redraw: () => {}};

  const query = () => (st.hover !== null ? st.hover : st.pinned);
  const seq = () => st.maps.seq2seq && st.maps.seq2seq.sentences[st.sentence];
  const shape = () => (st.attention === "encoder" ? st.maps.model : st.maps.seq2seq.model);
  // Rows are the tokens that look (queries), columns the tokens looked at (keys): the same list
  // for self-attention; for cross-attention the target's and the source's.
  const labels = () => (st.attention === "encoder" ? st.maps.sentences[st.sentence].labels : seq().target);
  const colLabels = () => (st.attention === "cross" ? seq().source : labels());
  const isMark = () => (st.attention === "encoder" ? st.maps.sentences[st.sentence].is_mark : seq().target_is_mark);
  // The server's maps say the source's marks at the cross maps' level, which may differ from the
  // encoder's (word-level encoder maps beside token-level cross maps); a page's levels always agree.
  const colMark = () => (st.attention === "cross" ? seq().source_is_mark || st.maps.sentences[st.sentence].is_mark : isMark());
  const nRows = () => st.map.rows || st.map.n;
  const nCols = () => st.map.cols || st.map.n;
  const weight = (i, j) => st.map.weights[i * nCols() + j];
  const sinkShare = (i) => (st.map && st.map.sink ? st.map.sink[i] : null); // learned sinks only

  function options(count, selected) {
    return Array.from({length: count}, (_, i) => el("option", {value: i + 1, selected: i + 1 === selected, text: i + 1}));
  }

  function controls() {
    const m = st.maps;
    const lv = (m.seq2seq && m.seq2seq.level) || "token"; // the decoder's and cross maps' level
    const pick = (key) => (e) => { st[key] = Number(e.target.value); load(); };
    const pickAttention = (e) => {
      st.attention = e.target.value; st.pinned = null; st.hover = null;
      st.layer = Math.min(st.layer, shape().num_layers); st.head = Math.min(st.head, shape().num_heads);
      load();
    };
    return el("div", {class: "controls"},
      m.seq2seq ? el("label", {}, "Attention ", el("select", {id: "head-attention", onchange: pickAttention},
        Object.keys(AL.ATTENTIONS).map((k) => el("option", {value: k, selected: k === st.attention, text: k})))) : null,
      m.sentences.length > 1 ? el("label", {}, "Sentence ", el("select", {id: "head-sentence", class: "sentence-pick",
        title: m.sentences[st.sentence].text, onchange: (e) => { st.sentence = Number(e.target.value); st.pinned = null; load(); },
      }, m.sentences.map((s, i) => el("option", {value: i, selected: i === st.sentence, text: `${i + 1}: ${s.text}`})))) : null,
      el("label", {}, "Layer ", el("select", {id: "head-layer", onchange: pick("layer")}, options(shape().num_layers, st.layer))),
      el("label", {}, "Head ", el("select", {id: "head-head", onchange: pick("head")}, options(shape().num_heads, st.head))),
      el("label", {}, "Show the row as ", el("select", {id: "head-display", onchange: (e) => { st.display = e.target.value; render(); }},
        el("option", {value: "lines", selected: st.display === "lines", text: "lines"}),
        el("option", {value: "heat", selected: st.display === "heat", text: "heat"}))),
      el("span", {class: "muted", text: st.attention === "cross" ? `${lv} level · ${labels().length} target × ${colLabels().length} source ${lv}s`
        : `${st.attention === "decoder" ? lv : m.level} level · ${labels().length} ${st.attention === "decoder" ? lv : m.level}s`}));
  }

  // The sentence as chips, coloured by the chosen word's row: the row as heat over the text. For
  // cross-attention two strips: the target's chips choose the row, the source's show it.
  function strip() {
    const box = el("div", {id: "head-words", class: "strip"}, labels().map((w, j) => el("span", {
      class: `word${isMark()[j] ? " mark" : ""}`, "data-index": j, text: w,
      onclick: () => choose(j), onmouseenter: () => preview(j), onmouseleave: () => preview(null),
    })));
    if (st.attention !== "cross") {
      paintStrip(box);
      if (!st.map || !st.map.sink) return box;
      const chip = el("span", {id: "head-sink-chip", class: "word mark sink", text: "sink"});
      paintSink(chip);
      return el("div", {class: "strip-row"}, box, chip);
    }
    const keys = el("div", {id: "head-keys", class: "strip"}, colLabels().map((w, j) => el("span", {
      class: `word${colMark()[j] ? " mark" : ""}`, "data-index": j, text: w})));
    paintStrip(box, keys);
    return el("div", {class: "strips"}, el("span", {class: "muted", text: "target (looks):"}), box,
      el("span", {class: "muted", text: "source (looked at):"}), keys);
  }

  function paintStrip(box, keys = box) {
    const q = query();
    box.childNodes.forEach((chip, j) => chip.classList.toggle("chosen", j === q));
    keys.childNodes.forEach((chip, j) => {
      const w = q !== null && st.map ? weight(q, j) : 0;
      chip.style.background = q !== null && st.map ? AL.heat(w) : "";
      chip.style.color = w > 0.45 ? "#fff" : ""; // readable on the dark end of the ramp
    });
  }

  // The sink chip: the chosen row's sink share as heat, and as a number in its tooltip.
  function paintSink(chip) {
    const q = query(), s = q === null ? null : sinkShare(q);
    chip.style.background = s === null ? "" : AL.heat(s);
    chip.style.color = s !== null && s > 0.45 ? "#fff" : "";
    chip.title = s === null ? "the learned sink: the share of a row that goes to no word" : `the learned sink takes ${AL.pct1(s)} of this row`;
  }

  function rowList() {
    const q = query();
    if (q === null || !st.map) return el("aside", {id: "head-side"}, el("p", {class: "muted", text: "Hover or click a word."}));
    const order = Array.from({length: nCols()}, (_, j) => j).sort((a, b) => weight(q, b) - weight(q, a)).slice(0, TOP_K);
    return el("aside", {id: "head-side"},
      el("h3", {id: "head-query", text: `"${labels()[q]}" looks at`}),
      sinkShare(q) === null ? null : el("p", {id: "head-sink", class: "muted",
        text: `the learned sink takes ${AL.pct1(sinkShare(q))}: the weights add up to ${AL.pct1(1 - sinkShare(q))}`}),
      el("ol", {id: "head-row"}, order.map((j) => el("li", {"data-index": j},
        el("span", {class: "w", text: colLabels()[j]}), " ",
        el("span", {class: "bar"}, el("span", {class: "fill", style: `width:${(100 * weight(q, j)).toFixed(1)}%`})), " ",
        el("span", {class: "num pct", text: AL.pct1(weight(q, j))})))));
  }

  const viewH = () => Math.min(MAX_VIEW_H, Math.max(nRows(), nCols()) * ROW);

  function drawLines(canvas, scroller) {
    if (!st.map || !canvas.isConnected) return; // a newer head replaced this panel
    const VIEW_H = viewH(), n = nCols(), W = canvas.parentElement.clientWidth || 600, colW = 160;
    const top = scroller.scrollTop;
    const first = Math.max(0, Math.floor(top / ROW)), lastAt = (k) => Math.min(k - 1, Math.ceil((top + VIEW_H) / ROW));
    const last = lastAt(nRows()), lastCol = lastAt(n); // the left column lists the rows, the right one the columns
    canvas.style.top = `${top}px`;
    const ctx = AL.fitCanvas(canvas, W, VIEW_H);
    const y = (i) => i * ROW + ROW / 2 - top;
    const q = query();
    ctx.font = "13px sans-serif";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    for (let i = first; i <= last; i++) {
      ctx.fillStyle = i === q ? "#c0392b" : isMark()[i] ? "#888" : "#222";
      ctx.fillText(labels()[i], colW - 8, y(i));
    }
    ctx.textAlign = "left";
    for (let j = first; j <= lastCol; j++) {
      ctx.fillStyle = colMark()[j] ? "#888" : "#222";
      ctx.fillText(colLabels()[j], W - colW + 8, y(j));
    }
    // Strength relative to the row's largest weight: over 512 words every weight is small, and
    // absolute opacities would draw nothing.
    const maxes = new Map();
    const rowMax = (i) => {
      if (!maxes.has(i)) { let m = 0; for (let j = 0; j < n; j++) m = Math.max(m, weight(i, j)); maxes.set(i, m || 1); }
      return maxes.get(i);
    };
    st.drawn = []; // [row, column, weight] of every line drawn: what a test reads back
    const line = (i, j, w, color) => {
      st.drawn.push([i, j, w]);
      const r = w / rowMax(i);
      ctx.strokeStyle = color; ctx.globalAlpha = 0.9 * r; ctx.lineWidth = 1 + 3 * r;
      const yi = Math.max(0, Math.min(VIEW_H, y(i)));
      ctx.beginPath(); ctx.moveTo(colW, yi); ctx.lineTo(W - colW, y(j)); ctx.stroke();
    };
    // One word chosen: its whole row (off-screen start clamped to the edge); else every visible pair.
    if (q !== null) for (let j = first; j <= lastCol; j++) line(q, j, weight(q, j), "#c0392b");
    else for (let i = first; i <= last; i++) for (let j = first; j <= lastCol; j++) line(i, j, weight(i, j), "#2c6fbb");
    ctx.globalAlpha = 1;
  }

  function linesPanel() {
    const canvas = el("canvas", {id: "head-lines", class: "overlay"});
    const spacer = el("div", {class: "spacer", style: `height:${Math.max(nRows(), nCols()) * ROW}px`}, canvas);
    const VIEW_H = viewH();
    const scroller = el("div", {id: "head-scroll", class: "scroller", style: `height:${VIEW_H + 2}px`}, spacer);
    const rowAt = (e) => {
      const r = canvas.getBoundingClientRect();
      const j = Math.floor((e.clientY - r.top + scroller.scrollTop) / ROW);
      return e.clientX - r.left < 160 && j >= 0 && j < nRows() ? j : null;
    };
    st.drawn = []; // until this panel's first frame: no lines of the head shown before
    st.redraw = () => drawLines(canvas, scroller);
    scroller.addEventListener("scroll", st.redraw);
    canvas.addEventListener("mousemove", (e) => preview(rowAt(e)));
    canvas.addEventListener("mouseleave", () => preview(null));
    canvas.addEventListener("click", (e) => { const j = rowAt(e); if (j !== null) choose(j); });
    requestAnimationFrame(() => {
      const q = query();
      if (q !== null && (q * ROW < scroller.scrollTop || q * ROW > scroller.scrollTop + VIEW_H)) scroller.scrollTop = q * ROW - VIEW_H / 3;
      drawLines(canvas, scroller);
    });
    return scroller;
  }

  // Word labels along both axes and a colour scale beside the map (AL.heatFrame), so that the heat
  // reads without hovering.
  const {left: HEAT_LEFT, top: HEAT_TOP, scale: SCALE_W, bottom: HEAT_BOTTOM} = AL.HEAT;

  // An n x m map (rows x columns) has square cells, its longer side px pixels: W x H.
  const heatSize = (n, m, px) => { const cell = px / Math.max(n, m); return {cell, W: m * cell, H: n * cell, SH: Math.max(n * cell, 120)}; };

  const heatAxes = (canvas, n, m, px) => AL.heatFrame(canvas, labels(), colLabels(), heatSize(n, m, px).cell);

  function heatPanel() {
    const n = nRows(), m = nCols(), px = Math.min(MAX_VIEW_H, Math.max(240, Math.max(n, m) * 16));
    const {cell: side, W, H, SH} = heatSize(n, m, px);
    const at = `left:${HEAT_LEFT}px;top:${HEAT_TOP}px`;
    const axes = el("canvas", {id: "head-heat-axes", class: "axes"});
    heatAxes(axes, n, m, px);
    const image = el("canvas", {id: "head-heat", class: "matrix", style: at});
    AL.drawMatrix(image, st.map.weights, n, px, m);
    const mark = el("canvas", {class: "overlay", style: at});
    st.redraw = () => {
      if (!st.map || !mark.isConnected) return;
      const q = query();
      const ctx = AL.fitCanvas(mark, W, H);
      if (q === null) return;
      ctx.strokeStyle = "#c0392b"; ctx.lineWidth = 2;
      ctx.strokeRect(0, q * side, W, Math.max(2, side));
    };
    st.redraw();
    const tip = el("p", {id: "head-tip", class: "muted", text: st.attention === "cross"
      ? "rows: the target token that looks (query), columns: the source token it looks at (key)"
      : "rows: the word that looks (from), columns: the word it looks at (to)"});
    const cell = (e) => {
      const r = mark.getBoundingClientRect();
      return [Math.floor((e.clientY - r.top) / side), Math.floor((e.clientX - r.left) / side)];
    };
    mark.addEventListener("mousemove", (e) => {
      const [i, j] = cell(e);
      if (i >= 0 && i < n && j >= 0 && j < m) tip.textContent = `"${labels()[i]}" → "${colLabels()[j]}": ${AL.pct1(weight(i, j))}`;
    });
    mark.addEventListener("click", (e) => { const i = cell(e)[0]; if (i >= 0 && i < n) choose(i); });
    return el("div", {}, el("div", {class: "stack", style: `width:${HEAT_LEFT + W + SCALE_W}px;height:${HEAT_TOP + SH + HEAT_BOTTOM}px`},
      axes, image, mark), tip);
  }

  function render() {
    const root = document.getElementById("view-head");
    if (!st.maps) { root.replaceChildren(el("p", {class: "muted", text: "No maps yet."})); return; }
    const m = st.maps;
    root.replaceChildren(controls(),
      el("p", {id: "head-caption", class: "lead", text: `${m.model.id}: ${m.seq2seq ? `${AL.ATTENTIONS[st.attention]}, ` : ""}layer ${st.layer}, head ${st.head} of ${shape().num_layers} × ${shape().num_heads}`}),
      strip(),
      st.map ? el("div", {class: "head-body"}, el("div", {class: "head-main"}, st.display === "lines" ? linesPanel() : heatPanel()), rowList())
        : el("p", {class: "muted", text: "loading…"}));
  }

  function choose(j) { st.pinned = j; st.hover = null; render(); }

  // Hover previews a row without pinning it: the panel is redrawn in place (the scroll position
  // stays), the strip and the list are rebuilt.
  function preview(j) {
    if (j === st.hover || !st.map) return;
    st.hover = j;
    st.redraw();
    document.getElementById("head-side").replaceWith(rowList());
    const box = document.getElementById("head-words");
    paintStrip(box, document.getElementById("head-keys") || box);
    const chip = document.getElementById("head-sink-chip");
    if (chip) paintSink(chip);
  }

  async function load() {
    const ticket = ++st.ticket;
    st.map = null;
    render();
    try {
      const map = await st.source.head(st.sentence, st.layer, st.head, st.attention);
      if (ticket !== st.ticket) return; // a later choice won
      st.map = map;
      render();
    } catch (e) { AL.status(e.message, true); }
  }

  AL.on("maps", ({maps, source}) => {
    Object.assign(st, {maps, source, sentence: 0, pinned: null, hover: null});
    if (!maps.seq2seq) st.attention = "encoder";
    st.layer = Math.min(st.layer, shape().num_layers);
    st.head = Math.min(st.head, shape().num_heads);
    load();
  });
  AL.on("select-head", ({sentence, layer, head}) => {
    Object.assign(st, {sentence: sentence || 0, layer, head, attention: "encoder"}); // the model view shows the encoder's heads
    load();
  });
  AL.head = {render, drawn: () => st.drawn};
})();
