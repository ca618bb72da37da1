// The Scene view: the lesson's worked example, step by step. The query of "bank" meets each key
// (dot products), softmax turns the scores into weights (bars), and the weights blend the values
// into a new vector (an arrow in the plane of the two value axes). A toggle divides by √d.
"use strict";
(function () {
  const AL = window.attnlab;
  const el = AL.el;
  const STEPS = [
    "The query of the word and the key of every word",
    "Dot product of the query with each key: the scores",
    "Softmax: the scores become weights that add up to 1",
    "The weights blend the values into a new vector",
  ];
  let scene = null;
  const state = {step: 1, scaled: false}; // a learner starts at the first step

  function arrow(ctx, x0, y0, x1, y1, color, dashed) {
    ctx.strokeStyle = ctx.fillStyle = color;
    ctx.lineWidth = 2.5;
    ctx.setLineDash(dashed ? [5, 4] : []);
    ctx.beginPath(); ctx.moveTo(x0, y0); ctx.lineTo(x1, y1); ctx.stroke();
    ctx.setLineDash([]);
    const a = Math.atan2(y1 - y0, x1 - x0);
    ctx.beginPath();
    ctx.moveTo(x1, y1);
    ctx.lineTo(x1 - 11 * Math.cos(a - 0.4), y1 - 11 * Math.sin(a - 0.4));
    ctx.lineTo(x1 - 11 * Math.cos(a + 0.4), y1 - 11 * Math.sin(a + 0.4));
    ctx.fill();
  }

  // The values as points in the (riverbank, money) plane, the blended vector as an arrow, and the
  // other setting's vector dashed, so that the effect of √d is seen.
  function drawPlane(canvas, on, off) {
    const W = 460, H = 300, pad = 44;
    const ctx = AL.fitCanvas(canvas, W, H);
    const X = (x) => pad + x * (W - 3 * pad);
    const Y = (y) => H - pad - y * (H - 2 * pad) * 1.6;
    ctx.strokeStyle = "#999"; ctx.lineWidth = 1;
    ctx.beginPath(); ctx.moveTo(X(0), Y(0)); ctx.lineTo(X(1.05), Y(0));
    ctx.moveTo(X(0), Y(0)); ctx.lineTo(X(0), Y(0.55)); ctx.stroke();
    ctx.fillStyle = "#333"; ctx.font = "13px sans-serif";
    ctx.fillText(scene.value_axes[0], X(1.05) - 60, Y(0) + 24);
    ctx.save(); ctx.translate(X(0) - 14, Y(0.3)); ctx.rotate(-Math.PI / 2);
    ctx.fillText(scene.value_axes[1], 0, 0); ctx.restore();
    const seen = new Set();
    scene.values.forEach((v, j) => {
      if (v[0] === 0 && v[1] === 0) return;
      ctx.fillStyle = "#555";
      ctx.beginPath(); ctx.arc(X(v[0]), Y(v[1]), 4, 0, 2 * Math.PI); ctx.fill();
      const key = v.join(",");
      if (!seen.has(key)) ctx.fillText(`v(${scene.tokens[j]})`, X(v[0]) + 6, Y(v[1]) - 6);
      seen.add(key);
    });
    arrow(ctx, X(0), Y(0), X(off.output[0]), Y(off.output[1]), "#bbb", true);
    arrow(ctx, X(0), Y(0), X(on.output[0]), Y(on.output[1]), "#c0392b", false);
  }

  function render() {
    const root = document.getElementById("view-scene");
    const run = state.scaled ? scene.scaled : scene.unscaled;
    const other = state.scaled ? scene.unscaled : scene.scaled;
    const d = scene.query.length;
    const show = (k) => state.step >= k;
    const scoreHead = state.scaled ? `q·k / √${d}` : "q·k";
    const rows = scene.tokens.map((tok, j) => el("tr", {"data-token": tok, class: tok === scene.query_token ? "query" : ""},
      el("td", {text: tok}),
      el("td", {class: "num", text: `(${scene.keys[j].map((x) => x.toFixed(1)).join(", ")})`}),
      show(2) ? el("td", {class: "num score", text: run.scores[j].toFixed(2)}) : null,
      show(3) ? el("td", {class: "bar"}, el("span", {class: "fill", style: `width:${(100 * run.weights[j]).toFixed(1)}%`})) : null,
      show(3) ? el("td", {class: "num weight", text: AL.pct(run.weights[j])}) : null));
    const table = el("table", {id: "scene-table", class: "scene"},
      el("thead", {}, el("tr", {},
        el("th", {text: "word"}), el("th", {text: "key k"}),
        show(2) ? el("th", {text: scoreHead}) : null,
        show(3) ? el("th", {text: "weight"}) : null, show(3) ? el("th", {}) : null)),
      el("tbody", {}, rows));
    const canvas = el("canvas", {id: "scene-plane"});
    const out = `(${run.output.map((x) => x.toFixed(2)).join(", ")})`;
    root.replaceChildren(
      el("p", {class: "lead"},
        `"${scene.tokens.join(" ")}": the query of "${scene.query_token}" is q = (${scene.query.join(", ")}), d = ${d}.`),
      el("div", {class: "controls"},
        el("button", {id: "scene-back", disabled: state.step <= 1, onclick: () => { state.step--; render(); }, text: "← Back"}),
        el("span", {id: "scene-step", text: `Step ${state.step} of ${STEPS.length}: ${STEPS[state.step - 1]}`}),
        el("button", {id: "scene-next", disabled: state.step >= STEPS.length, onclick: () => { state.step++; render(); }, text: "Next →"}),
        el("label", {class: "toggle"},
          el("input", {type: "checkbox", id: "scene-scale", checked: state.scaled,
            onchange: (e) => { state.scaled = e.target.checked; render(); }}),
          ` divide the scores by √d = √${d}`)),
      el("div", {class: "scene-body"}, table,
        show(4) ? el("figure", {}, canvas, el("figcaption", {id: "scene-output"},
          `blended vector (${scene.value_axes.join(", ")}) = ${out}` +
          ` (dashed: ${state.scaled ? "without" : "with"} the division by √${d})`)) : null));
    if (show(4)) drawPlane(canvas, run, other);
  }

  AL.scene = {
    async show(source) {
      if (!scene) scene = await source.scene();
      if (scene) render();
    },
  };
})();
