// The Neuron view: what one weight is made of, for a real model (bertviz's neuron view). Pick a
// layer, a head and a query word: its query q, each key k, their elementwise product q∘k as colour
// bars, the score q·k, the scaled score (and softcapped, for Gemma-2), and the weight, in the four
// steps of the Scene, so that the lesson's toy and the real model read the same way. The data are
// the queries and keys capture(..., qk=True) keeps; the weights are recomputed here from them.
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
  const CELL = 4; // px per vector component in the colour bars
  let data = null;
  const state = {sentence: 0, layer: 1, head: 1, query: -1, step: 1}; // query −1: the sentence's last token

  // A vector as a strip of coloured cells: blue for positive components, orange for negative.
  function bars(vec, max) {
    const c = el("canvas", {class: "vec", title: vec.map((x) => x.toFixed(2)).join(", ")});
    const ctx = AL.fitCanvas(c, vec.length * CELL, 12);
    vec.forEach((x, d) => {
      const t = Math.min(1, Math.abs(x) / (max || 1));
      ctx.fillStyle = x >= 0 ? `rgba(44,111,187,${t})` : `rgba(211,84,0,${t})`;
      ctx.fillRect(d * CELL, 0, CELL, 12);
    });
    return c;
  }

  const maxAbs = (rows) => rows.reduce((m, r) => r.reduce((a, x) => Math.max(a, Math.abs(x)), m), 0);

  // The row of weights of query i, recomputed as the model does: q·k · scale, softcap, mask, softmax.
  AL.neuronRow = function (q, keys, i, meta, layer) {
    const scale = meta.scale[layer], cap = meta.softcap[layer], win = meta.window[layer];
    const dots = keys.map((k) => k.reduce((s, x, d) => s + x * q[d], 0));
    const scaled = dots.map((s) => s * scale);
    const capped = cap ? scaled.map((s) => cap * Math.tanh(s / cap)) : scaled;
    const seen = keys.map((_, j) => (!meta.causal[layer] || j <= i) && (!win || (j >= i - win[0] && j <= i + win[1])));
    const top = Math.max(...capped.filter((_, j) => seen[j]));
    const e = capped.map((s, j) => (seen[j] ? Math.exp(s - top) : 0));
    const total = e.reduce((a, b) => a + b, 0);
    return {dots, scaled, capped, seen, weights: e.map((x) => x / total)};
  }

  function select(label, n, value, onchange, names) {
    const s = el("select", {"aria-label": label, onchange: (ev) => onchange(Number(ev.target.value))},
      ...Array.from({length: n}, (_, k) => el("option", {value: k + (names ? 0 : 1), text: names ? names[k] : `${label} ${k + 1}`})));
    s.value = String(value);
    return s;
  }

  function render() {
    const root = document.getElementById("view-neuron");
    const s = data.sentences[state.sentence];
    const m = data.model;
    const controls = el("div", {class: "controls"},
      data.sentences.length > 1 ? select("sentence", data.sentences.length, state.sentence,
        (v) => { state.sentence = v; state.query = -1; render(); }, data.sentences.map((x) => x.text)) : null,
      select("layer", m.num_layers, state.layer, (v) => { state.layer = v; render(); }),
      select("head", m.num_heads, state.head, (v) => { state.head = v; render(); }),
      ...STEPS.map((_, k) => el("button", {class: state.step === k + 1 ? "active" : "", text: `step ${k + 1}`,
        onclick: () => { state.step = k + 1; render(); }})));
    if (!s.q) {
      root.replaceChildren(controls, el("p", {class: "muted",
        text: `This sentence has ${s.labels.length} tokens; the neuron view keeps queries and keys of sentences up to ${data.max_tokens}.`}));
      return;
    }
    if (state.query < 0 || state.query >= s.labels.length) state.query = s.labels.length - 1;
    const L = state.layer - 1, H = state.head - 1, i = state.query;
    const qs = s.q[L][H], ks = s.k[L][H], q = qs[i];
    const row = AL.neuronRow(q, ks, i, data.meta, L);
    const prods = ks.map((k) => k.map((x, d) => x * q[d]));
    const vmax = Math.max(maxAbs(qs), maxAbs(ks)), pmax = maxAbs(prods);
    const show = (k) => state.step >= k;
    const meta = data.meta, cap = meta.softcap[L], win = meta.window[L];
    const strip = el("div", {class: "strip"}, ...s.labels.map((t, j) =>
      el("span", {class: `word${j === i ? " chosen" : ""}`, text: t, onclick: () => { state.query = j; render(); }})));
    const scaledHead = `× ${meta.scale[L].toPrecision(3)}` + (cap ? `, ${cap}·tanh(·/${cap})` : "");
    const table = el("table", {class: "scene neuron"},
      el("thead", {}, el("tr", {},
        el("th", {text: "key"}), el("th", {text: "k"}),
        show(2) ? el("th", {text: "q∘k"}) : null, show(2) ? el("th", {text: "q·k"}) : null,
        show(2) ? el("th", {text: scaledHead}) : null,
        show(3) ? el("th", {text: "weight"}) : null, show(3) ? el("th", {}) : null)),
      el("tbody", {}, ...ks.map((k, j) => el("tr", {class: j === i ? "query" : "", "data-token": s.labels[j]},
        el("td", {text: s.labels[j]}), el("td", {}, bars(k, vmax)),
        show(2) ? el("td", {}, bars(prods[j], pmax)) : null,
        show(2) ? el("td", {class: "num", text: row.dots[j].toFixed(2)}) : null,
        show(2) ? el("td", {class: "num", text: row.seen[j] ? row.capped[j].toFixed(2) : "masked"}) : null,
        show(3) ? el("td", {class: "bar"}, el("span", {class: "fill", style: `width:${(100 * row.weights[j]).toFixed(1)}%`})) : null,
        show(3) ? el("td", {class: "num weight", text: AL.pct1(row.weights[j])}) : null))));
    const best = row.weights.map((w, j) => [w, j]).sort((a, b) => b[0] - a[0]).slice(0, 3);
    root.replaceChildren(...[
      controls,
      el("p", {class: "lead"}, `Step ${state.step}: ${STEPS[state.step - 1]}. `,
        el("span", {class: "muted", text: `Layer ${state.layer}, head ${state.head}; scale ${meta.scale[L].toPrecision(3)}` +
          (meta.causal[L] ? ", causal" : "") + (win ? `, sliding window ${win[0] + 1}` : "") + (cap ? `, softcap ${cap}` : "")})),
      el("p", {class: "muted", text: "Click a word to make it the query."}), strip,
      el("p", {}, el("b", {text: `q(${s.labels[i]}) `}), bars(q, vmax)),
      table,
      show(4) ? el("p", {class: "lead", text: `The weights blend the values: ${best.map(([w, j]) =>
        `${AL.pct(w)} of ${s.labels[j]}`).join(", ")}… (values are not kept; the head view shows every row).`}) : null,
    ].filter(Boolean));
  }

  AL.neuron = {
    show(payload) {
      data = payload;
      render();
    },
  };
})();
