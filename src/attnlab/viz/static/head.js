// The Head view: one head of one layer (1-based, as printed everywhere). Hover or click a word to
// see its row of weights: as lines from the word to every word (bertviz's picture), or as heat
// over the whole map; the sentence strip is coloured by the same row, and a list gives the
// largest weights as numbers. Long inputs stay fast: the lines are drawn on a canvas for the rows
// on screen only, and the heat map is one image of n x n pixels.
"use strict";
(function () {
  const AL = window.attnlab;
  const el = AL.el;
  const ROW = 20; // px per word in the lines display
  const MAX_VIEW_H = 480; // px of the scrolling lines display, at most
  const TOP_K = 10;
  const st = {maps: null, source: null, sentence: 0, layer: 1, head: 1, pinned: null, hover: null,
    display: "lines", map: null, ticket: 0, redraw: () => {}};

  const query = () => (st.hover !== null ? st.hover : st.pinned);
  const labels = () => st.maps.sentences[st.sentence].labels;
  const isMark = () => st.maps.sentences[st.sentence].is_mark;
  const weight = (i, j) => st.map.weights[i * st.map.n + j];

  function options(count, selected) {
    return Array.from({length: count}, (_, i) => el("option", {value: i + 1, selected: i + 1 === selected, text: i + 1}));
  }

  function controls() {
    const m = st.maps;
    const pick = (key) => (e) => { st[key] = Number(e.target.value); load(); };
    return el("div", {class: "controls"},
      m.sentences.length > 1 ? el("label", {}, "Sentence ", el("select", {id: "head-sentence", class: "sentence-pick",
        title: m.sentences[st.sentence].text, onchange: (e) => { st.sentence = Number(e.target.value); st.pinned = null; load(); },
      }, m.sentences.map((s, i) => el("option", {value: i, selected: i === st.sentence, text: `${i + 1}: ${s.text}`})))) : null,
      el("label", {}, "Layer ", el("select", {id: "head-layer", onchange: pick("layer")}, options(m.model.num_layers, st.layer))),
      el("label", {}, "Head ", el("select", {id: "head-head", onchange: pick("head")}, options(m.model.num_heads, st.head))),
      el("label", {}, "Show the row as ", el("select", {id: "head-display", onchange: (e) => { st.display = e.target.value; render(); }},
        el("option", {value: "lines", selected: st.display === "lines", text: "lines"}),
        el("option", {value: "heat", selected: st.display === "heat", text: "heat"}))),
      el("span", {class: "muted", text: `${m.level} level · ${labels().length} ${m.level}s`}));
  }

  // The sentence as chips, coloured by the chosen word's row: the row as heat over the text.
  function strip() {
    const box = el("div", {id: "head-words", class: "strip"}, labels().map((w, j) => el("span", {
      class: `word${isMark()[j] ? " mark" : ""}`, "data-index": j, text: w,
      onclick: () => choose(j), onmouseenter: () => preview(j), onmouseleave: () => preview(null),
    })));
    paintStrip(box);
    return box;
  }

  function paintStrip(box) {
    const q = query();
    box.childNodes.forEach((chip, j) => {
      chip.classList.toggle("chosen", j === q);
      const w = q !== null && st.map ? weight(q, j) : 0;
      chip.style.background = q !== null && st.map ? AL.heat(w) : "";
      chip.style.color = w > 0.45 ? "#fff" : ""; // readable on the dark end of the ramp
    });
  }

  function rowList() {
    const q = query();
    if (q === null || !st.map) return el("aside", {id: "head-side"}, el("p", {class: "muted", text: "Hover or click a word."}));
    const n = st.map.n;
    const order = Array.from({length: n}, (_, j) => j).sort((a, b) => weight(q, b) - weight(q, a)).slice(0, TOP_K);
    return el("aside", {id: "head-side"},
      el("h3", {id: "head-query", text: `"${labels()[q]}" looks at`}),
      el("ol", {id: "head-row"}, order.map((j) => el("li", {"data-index": j},
        el("span", {class: "w", text: labels()[j]}), " ",
        el("span", {class: "bar"}, el("span", {class: "fill", style: `width:${(100 * weight(q, j)).toFixed(1)}%`})), " ",
        el("span", {class: "num pct", text: AL.pct1(weight(q, j))})))));
  }

  const viewH = () => Math.min(MAX_VIEW_H, st.map.n * ROW);

  function drawLines(canvas, scroller) {
    if (!st.map || !canvas.isConnected) return; // a newer head replaced this panel
    const VIEW_H = viewH(), n = st.map.n, W = canvas.parentElement.clientWidth || 600, colW = 160;
    const top = scroller.scrollTop;
    const first = Math.max(0, Math.floor(top / ROW)), last = Math.min(n - 1, Math.ceil((top + VIEW_H) / ROW));
    canvas.style.top = `${top}px`;
    const ctx = AL.fitCanvas(canvas, W, VIEW_H);
    const y = (i) => i * ROW + ROW / 2 - top;
    const q = query();
    ctx.font = "13px sans-serif";
    ctx.textBaseline = "middle";
    for (let i = first; i <= last; i++) {
      ctx.fillStyle = i === q ? "#c0392b" : isMark()[i] ? "#888" : "#222";
      ctx.textAlign = "right"; ctx.fillText(labels()[i], colW - 8, y(i));
      ctx.textAlign = "left"; ctx.fillText(labels()[i], W - colW + 8, y(i));
    }
    // Strength relative to the row's largest weight: over 512 words every weight is small, and
    // absolute opacities would draw nothing.
    const maxes = new Map();
    const rowMax = (i) => {
      if (!maxes.has(i)) { let m = 0; for (let j = 0; j < n; j++) m = Math.max(m, weight(i, j)); maxes.set(i, m || 1); }
      return maxes.get(i);
    };
    const line = (i, j, w, color) => {
      const r = w / rowMax(i);
      ctx.strokeStyle = color; ctx.globalAlpha = 0.9 * r; ctx.lineWidth = 1 + 3 * r;
      const yi = Math.max(0, Math.min(VIEW_H, y(i)));
      ctx.beginPath(); ctx.moveTo(colW, yi); ctx.lineTo(W - colW, y(j)); ctx.stroke();
    };
    // One word chosen: its whole row (off-screen start clamped to the edge); else every visible pair.
    if (q !== null) for (let j = first; j <= last; j++) line(q, j, weight(q, j), "#c0392b");
    else for (let i = first; i <= last; i++) for (let j = first; j <= last; j++) line(i, j, weight(i, j), "#2c6fbb");
    ctx.globalAlpha = 1;
  }

  function linesPanel() {
    const canvas = el("canvas", {id: "head-lines", class: "overlay"});
    const spacer = el("div", {class: "spacer", style: `height:${st.map.n * ROW}px`}, canvas);
    const VIEW_H = viewH();
    const scroller = el("div", {id: "head-scroll", class: "scroller", style: `height:${VIEW_H + 2}px`}, spacer);
    const rowAt = (e) => {
      const r = canvas.getBoundingClientRect();
      const j = Math.floor((e.clientY - r.top + scroller.scrollTop) / ROW);
      return e.clientX - r.left < 160 && j >= 0 && j < st.map.n ? j : null;
    };
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

  // Word labels along both axes (every k-th when rows are thinner than the text) and a colour
  // scale beside the map, so that the heat reads without hovering.
  const HEAT_LEFT = 96, HEAT_TOP = 84, SCALE_W = 64, HEAT_BOTTOM = 10;

  function heatAxes(canvas, n, px) {
    const ctx = AL.fitCanvas(canvas, HEAT_LEFT + px + SCALE_W, HEAT_TOP + px + HEAT_BOTTOM);
    const cell = px / n, step = Math.max(1, Math.ceil(12 / cell));
    const fit = (t) => (t.length > 12 ? `${t.slice(0, 11)}…` : t);
    ctx.font = "11px sans-serif";
    ctx.fillStyle = "#333";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    for (let i = 0; i < n; i += step) ctx.fillText(fit(labels()[i]), HEAT_LEFT - 4, HEAT_TOP + (i + 0.5) * cell);
    ctx.textAlign = "left";
    for (let j = 0; j < n; j += step) {
      ctx.save();
      ctx.translate(HEAT_LEFT + (j + 0.5) * cell, HEAT_TOP - 4);
      ctx.rotate(-Math.PI / 3);
      ctx.fillText(fit(labels()[j]), 0, 0);
      ctx.restore();
    }
    // The colour scale: the same ramp as the map, 0 % at the bottom to 100 % at the top.
    const x0 = HEAT_LEFT + px + 12, bar = 12;
    for (let y = 0; y < px; y++) {
      ctx.fillStyle = AL.heat(1 - y / (px - 1));
      ctx.fillRect(x0, HEAT_TOP + y, bar, 1);
    }
    ctx.strokeStyle = "#999";
    ctx.strokeRect(x0, HEAT_TOP, bar, px);
    ctx.fillStyle = "#333";
    for (const v of [0, 0.25, 0.5, 0.75, 1]) ctx.fillText(`${Math.round(100 * v)} %`, x0 + bar + 4, HEAT_TOP + (1 - v) * (px - 1));
  }

  function heatPanel() {
    const n = st.map.n, px = Math.min(MAX_VIEW_H, Math.max(240, n * 16));
    const at = `left:${HEAT_LEFT}px;top:${HEAT_TOP}px`;
    const axes = el("canvas", {id: "head-heat-axes", class: "axes"});
    heatAxes(axes, n, px);
    const image = el("canvas", {id: "head-heat", class: "matrix", style: at});
    AL.drawMatrix(image, st.map.weights, n, px);
    const mark = el("canvas", {class: "overlay", style: at});
    st.redraw = () => {
      if (!st.map || !mark.isConnected) return;
      const q = query();
      const ctx = AL.fitCanvas(mark, px, px);
      if (q === null) return;
      ctx.strokeStyle = "#c0392b"; ctx.lineWidth = 2;
      ctx.strokeRect(0, (q * px) / n, px, Math.max(2, px / n));
    };
    st.redraw();
    const tip = el("p", {id: "head-tip", class: "muted", text: "rows: the word that looks (from), columns: the word it looks at (to)"});
    const cell = (e) => {
      const r = mark.getBoundingClientRect();
      return [Math.floor(((e.clientY - r.top) / px) * n), Math.floor(((e.clientX - r.left) / px) * n)];
    };
    mark.addEventListener("mousemove", (e) => {
      const [i, j] = cell(e);
      if (i >= 0 && i < n && j >= 0 && j < n) tip.textContent = `"${labels()[i]}" → "${labels()[j]}": ${AL.pct1(weight(i, j))}`;
    });
    mark.addEventListener("click", (e) => choose(cell(e)[0]));
    return el("div", {}, el("div", {class: "stack", style: `width:${HEAT_LEFT + px + SCALE_W}px;height:${HEAT_TOP + px + HEAT_BOTTOM}px`},
      axes, image, mark), tip);
  }

  function render() {
    const root = document.getElementById("view-head");
    if (!st.maps) { root.replaceChildren(el("p", {class: "muted", text: "No maps yet."})); return; }
    const m = st.maps;
    root.replaceChildren(controls(),
      el("p", {id: "head-caption", class: "lead", text: `${m.model.id}: layer ${st.layer}, head ${st.head} of ${m.model.num_layers} × ${m.model.num_heads}`}),
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
    paintStrip(document.getElementById("head-words"));
  }

  async function load() {
    const ticket = ++st.ticket;
    st.map = null;
    render();
    try {
      const map = await st.source.head(st.sentence, st.layer, st.head);
      if (ticket !== st.ticket) return; // a later choice won
      st.map = map;
      render();
    } catch (e) { AL.status(e.message, true); }
  }

  AL.on("maps", ({maps, source}) => {
    Object.assign(st, {maps, source, sentence: 0, pinned: null, hover: null});
    st.layer = Math.min(st.layer, maps.model.num_layers);
    st.head = Math.min(st.head, maps.model.num_heads);
    load();
  });
  AL.on("select-head", ({sentence, layer, head}) => {
    Object.assign(st, {sentence: sentence || 0, layer, head});
    load();
  });
  AL.head = {render};
})();
