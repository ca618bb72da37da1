// The Generation view: a prompt, N new tokens, and for the step chosen on the slider what the token
// fed at that step looked at. Step t's row (Transformer.generate(..., maps=True)) is the attention of
// the query at position P − 1 + t, the token whose output chose new token t, over every position up
// to it, for each layer and head (chosen as in the head view, 1-based). Shown as lines from that
// token to every token before it (strength relative to the row's largest weight), or as heat: one
// row per step over all positions, the chosen step outlined; the token strip is coloured by the row.
// Served: the prompt box asks /api/generate; a page written by `attnlab generate --html` embeds the steps.
"use strict";
(function () {
  const AL = window.attnlab;
  const el = AL.el;
  const ROW = 18; // px per token in the lines display
  const MAX_VIEW_H = 480;
  const HEAT_CELL = 40, HEAT_CELL_MIN = 2, HEAT_ROW_MIN = 14; // px: the heat display's cells, at most and at least
  const HEAT_CAPTION = 48; // px under the map: its caption
  const TOP_K = 10;
  const st = {gen: null, source: null, served: false, info: null, step: 0, layer: 1, head: 1, display: "lines",
    drawn: [], form: null};

  const steps = () => st.gen.steps;
  const cur = () => steps()[st.step];
  // The chosen step's row for the chosen head: weights over positions 0..position.
  const row = () => cur().rows[st.layer - 1][st.head - 1];
  const labels = () => st.gen.labels;

  function options(count, selected) {
    return Array.from({length: count}, (_, i) => el("option", {value: i + 1, selected: i + 1 === selected, text: i + 1}));
  }

  // The prompt box, made once (what is typed stays while the step, layer or head change), again when
  // the server's answer about the model arrives.
  function promptForm() {
    if (!st.served) return null;
    if (st.form) return st.form;
    const g = st.info && st.info.generate;
    const refusal = g ? g.refusal : "asking the server what this model can do…";
    const max = g ? g.max_new_tokens : 1;
    const n = el("input", {id: "gen-n", type: "number", min: 1, max, value: Math.min(16, max), disabled: !!refusal});
    const button = el("button", {id: "gen-run", type: "submit", disabled: !!refusal,
      text: `Generate ${n.value} tokens`});
    n.addEventListener("input", () => { button.textContent = `Generate ${n.value} tokens`; });
    const form = el("form", {id: "gen-form", class: "controls"},
      el("label", {}, "Prompt ", el("input", {id: "gen-prompt", size: 60, disabled: !!refusal,
        value: "Return the number of"})),
      el("label", {}, "New tokens ", n), button,
      el("span", {id: "gen-status", class: `status${refusal ? " error" : ""}`, role: "status", text: refusal || ""}));
    form.addEventListener("submit", (e) => { e.preventDefault(); run(); });
    st.form = form;
    return form;
  }

  function controls() {
    const m = st.gen.model, pick = (key) => (e) => { st[key] = Number(e.target.value); render(); };
    const N = steps().length;
    return el("div", {class: "controls"},
      el("label", {}, "Layer ", el("select", {id: "gen-layer", onchange: pick("layer")}, options(m.num_layers, st.layer))),
      el("label", {}, "Head ", el("select", {id: "gen-head", onchange: pick("head")}, options(m.num_heads, st.head))),
      el("label", {}, "Show the row as ", el("select", {id: "gen-display", onchange: (e) => { st.display = e.target.value; render(); }},
        el("option", {value: "lines", selected: st.display === "lines", text: "lines"}),
        el("option", {value: "heat", selected: st.display === "heat", text: "heat"}))),
      el("label", {}, "Step ", el("input", {id: "gen-step", type: "range", min: 1, max: N, value: st.step + 1,
        oninput: (e) => { st.step = Number(e.target.value) - 1; render(); }}),
      el("span", {id: "gen-step-label", class: "num", text: ` ${st.step + 1} of ${N}`})));
  }

  function caption() {
    const s = cur(), q = labels()[s.position], chose = labels()[s.position + 1];
    return el("p", {id: "gen-caption", class: "lead",
      text: `${st.gen.model.id}: layer ${st.layer}, head ${st.head}. Step ${st.step + 1}: "${q}" (position ${s.position + 1}) ` +
        `looks at the ${s.position + 1} tokens up to itself, and its output chose "${chose}".`});
  }

  // Every token: the prompt's, then the generated ones; those up to the query coloured by its row.
  function strip() {
    const s = cur(), w = row();
    return el("div", {id: "gen-tokens", class: "strip"}, labels().map((text, j) => {
      const chip = el("span", {"data-index": j, text, class: ["word", "gen-token",
        j < st.gen.prompt_length ? "prompt" : "new", j === s.position ? "chosen" : "", j === s.position + 1 ? "next" : "",
        j > s.position ? "future" : ""].filter(Boolean).join(" ")});
      if (j <= s.position) {
        chip.style.background = AL.heat(w[j]);
        chip.style.color = w[j] > 0.45 ? "#fff" : "";
        chip.title = AL.pct1(w[j]);
      }
      return chip;
    }));
  }

  function rowList() {
    const w = row();
    const order = Array.from(w.keys()).sort((a, b) => w[b] - w[a]).slice(0, TOP_K);
    return el("aside", {id: "gen-side"},
      el("h3", {text: `"${labels()[cur().position]}" looks at`}),
      el("ol", {id: "gen-row"}, order.map((j) => el("li", {"data-index": j},
        el("span", {class: "w", text: labels()[j]}), " ",
        el("span", {class: "bar"}, el("span", {class: "fill", style: `width:${(100 * w[j]).toFixed(1)}%`})), " ",
        el("span", {class: "num pct", text: AL.pct1(w[j])})))));
  }

  function linesPanel() {
    const w = row(), n = w.length, q = cur().position, H = n * ROW;
    const canvas = el("canvas", {id: "gen-lines"});
    // [position, weight] of every line drawn, set with the panel (not in the frame that paints it), so
    // that it always tells the step, layer and head chosen last: what a test reads back
    st.drawn = Array.from(w, (x, j) => [j, x]);
    const scroller = el("div", {id: "gen-scroll", class: "scroller", style: `height:${Math.min(MAX_VIEW_H, H) + 2}px`}, canvas);
    requestAnimationFrame(() => {
      if (!canvas.isConnected) return;
      const W = scroller.clientWidth || 600, colW = 160;
      const ctx = AL.fitCanvas(canvas, W, H);
      const y = (j) => j * ROW + ROW / 2;
      ctx.font = "13px sans-serif";
      ctx.textBaseline = "middle";
      ctx.textAlign = "right";
      ctx.fillStyle = "#c0392b";
      ctx.fillText(labels()[q], colW - 8, y(q));
      ctx.textAlign = "left";
      let max = 0;
      for (let j = 0; j < n; j++) max = Math.max(max, w[j]);
      for (let j = 0; j < n; j++) {
        ctx.fillStyle = j < st.gen.prompt_length ? "#222" : "#2c6fbb";
        ctx.fillText(labels()[j], W - colW + 8, y(j));
        const r = w[j] / (max || 1);
        ctx.strokeStyle = "#c0392b"; ctx.globalAlpha = 0.9 * r; ctx.lineWidth = 1 + 3 * r;
        ctx.beginPath(); ctx.moveTo(colW, y(q)); ctx.lineTo(W - colW, y(j)); ctx.stroke();
        ctx.globalAlpha = 1;
      }
      scroller.scrollTop = Math.max(0, y(q) - MAX_VIEW_H / 2);
    });
    return scroller;
  }

  // One row per step over every position (zero where a step's query cannot see): the chosen head's
  // whole generation at a glance; click a row to choose its step. The map takes the panel's width: each
  // position a column as wide as the width allows (HEAT_CELL at most), each step a row as high as fits
  // above the window's bottom, but at least HEAT_ROW_MIN so that every step's token is labelled; drawn
  // once the panel has its size.
  function heatPanel() {
    const N = steps().length, T = steps()[N - 1].rows[0][0].length;
    const data = new Float32Array(N * T);
    steps().forEach((s, t) => { const w = s.rows[st.layer - 1][st.head - 1]; for (let j = 0; j < w.length; j++) data[t * T + j] = w[j]; });
    st.drawn = Array.from(row(), (w, j) => [j, w]);
    const rowLabels = steps().map((s) => labels()[s.position]);
    const stack = el("div", {id: "gen-heat-stack", class: "stack"});
    const panel = el("div", {class: "gen-heat-panel"}, stack,
      el("p", {class: "muted", text: "rows: the step (the token fed, that looks), columns: every position it may look at"}));
    requestAnimationFrame(() => {
      if (!panel.isConnected) return;
      const room = panel.clientWidth - AL.HEAT.left - AL.HEAT.scale; // px across, and down to the window's bottom
      const below = window.innerHeight - panel.getBoundingClientRect().top - AL.HEAT.top - AL.HEAT.bottom - HEAT_CAPTION;
      const cw = Math.max(HEAT_CELL_MIN, Math.min(HEAT_CELL, room / T));
      const ch = Math.max(HEAT_ROW_MIN, Math.min(HEAT_CELL, cw, below / N));
      const axes = el("canvas", {id: "gen-heat-axes", class: "axes"});
      const SH = AL.heatFrame(axes, rowLabels, labels().slice(0, T), cw, (i) => (i === st.step ? "#c0392b" : "#333"), ch);
      const at = `left:${AL.HEAT.left}px;top:${AL.HEAT.top}px`;
      const image = el("canvas", {id: "gen-heat", class: "matrix", style: at});
      AL.drawMatrix(image, data, N, T, T); // one pixel a cell, stretched below to cw x ch
      image.style.width = `${T * cw}px`;
      image.style.height = `${N * ch}px`;
      const mark = el("canvas", {class: "overlay", style: at});
      const ctx = AL.fitCanvas(mark, T * cw, N * ch);
      ctx.strokeStyle = "#c0392b"; ctx.lineWidth = 2;
      ctx.strokeRect(1, st.step * ch + 1, T * cw - 2, Math.max(2, ch - 2));
      mark.addEventListener("click", (e) => {
        const t = Math.floor((e.clientY - mark.getBoundingClientRect().top) / ch);
        if (t >= 0 && t < N) { st.step = t; render(); }
      });
      stack.style.width = `${AL.HEAT.left + T * cw + AL.HEAT.scale}px`;
      stack.style.height = `${AL.HEAT.top + SH + AL.HEAT.bottom}px`;
      stack.replaceChildren(axes, image, mark);
    });
    return panel;
  }

  function render() {
    const root = document.getElementById("view-generation");
    if (!st.gen) {
      root.replaceChildren(...[promptForm(), el("p", {class: "muted", text: st.served
        ? "Type a prompt and press Generate: each new token's attention over everything before it appears here."
        : "This page holds no generation."})].filter(Boolean));
      return;
    }
    st.step = Math.min(st.step, steps().length - 1);
    root.replaceChildren(...[promptForm(), controls(), caption(), strip(),
      el("div", {class: "head-body"}, st.display === "lines" ? el("div", {class: "head-main"}, linesPanel())
        : el("div", {class: "head-main wide"}, heatPanel()), rowList())].filter(Boolean));
  }

  async function run() {
    const prompt = document.getElementById("gen-prompt").value;
    const n = Number(document.getElementById("gen-n").value);
    const button = document.getElementById("gen-run"), status = document.getElementById("gen-status");
    button.disabled = true;
    status.classList.remove("error");
    status.textContent = `generating ${n} tokens…`;
    try {
      const t0 = performance.now();
      const gen = await st.source.generate({prompt, max_new_tokens: n});
      Object.assign(st, {gen, step: 0});
      st.layer = Math.min(st.layer, gen.model.num_layers);
      st.head = Math.min(st.head, gen.model.num_heads);
      render();
      status.textContent = `${gen.steps.length} tokens · ${(performance.now() - t0).toFixed(0)} ms`;
    } catch (e) {
      status.textContent = e.message;
      status.classList.add("error");
    } finally {
      button.disabled = false;
    }
  }

  async function show(source, served) {
    Object.assign(st, {source, served});
    if (!served) st.gen = await source.generation();
    render();
    if (served) {
      st.info = await source.info().catch((e) => ({generate: {refusal: e.message, max_new_tokens: 1}}));
      st.form = null;
      render();
    }
  }

  AL.generation = {show, render, drawn: () => st.drawn, state: () => ({step: st.step, layer: st.layer, head: st.head})};
})();
