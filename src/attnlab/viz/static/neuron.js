// The Neuron view: what one weight is made of, for a real model (bertviz's neuron view). Pick a
// layer, a head and a query word: its query q, each key k, their elementwise product q∘k as colour
// bars, the score q·k, the scaled score (and softcapped, for Gemma-2), the position bias where the
// model adds one (T5), and the weight, in the steps of the Scene, so that the lesson's toy and the
// real model read the same way. The data are the queries and keys capture(..., qk=True) keeps, one
// head at a time from the page's source (the embedded data, or the server's /api/neuron: the same
// shapes); the weights are recomputed here from them. An encoder–decoder offers its three
// attentions: encoder, decoder (causal self-attention over the target) and cross (target → source).
"use strict";
(function () {
  const AL = window.attnlab;
  const el = AL.el;
  const STEPS = {
    qk: "The query of the word and the key of every word",
    dot: "Dot product of the query with each key: the scores",
    bias: "The model adds its position bias to each score (T5: a learned number per head and distance)",
    softmax: "Softmax: the scores become weights that add up to 1",
    blend: "The weights blend the values into a new vector",
  };
  const CELL = 4; // px per vector component in the colour bars
  // query −1: the sentence's last token; step: 1-based index into the steps on show
  const st = {source: null, started: false, sentence: 0, layer: 1, head: 1, attention: "encoder", query: -1, step: 1,
    data: null, ticket: 0, error: null};

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

  // The row of weights of query i, recomputed as the model does: q·k · scale, softcap, + bias, mask,
  // softmax. meta: one layer's {scale, softcap, causal, window, sink_logits (learned sinks only)}; bias:
  // the query's row of the position bias (one number per key) or null; sink: the head's learned sink
  // logit or null, one more term of the softmax with no value (its share: `sink`, the weights the rest).
  AL.neuronRow = function (q, keys, i, meta, bias, sink = null) {
    const cap = meta.softcap, win = meta.window;
    const dots = keys.map((k) => k.reduce((s, x, d) => s + x * q[d], 0));
    const scaled = dots.map((s) => s * meta.scale);
    const capped = cap ? scaled.map((s) => cap * Math.tanh(s / cap)) : scaled;
    const scores = bias ? capped.map((s, j) => s + bias[j]) : capped;
    const seen = keys.map((_, j) => (!meta.causal || j <= i) && (!win || (j >= i - win[0] && j <= i + win[1])));
    const top = Math.max(...scores.filter((_, j) => seen[j]), sink === null ? -Infinity : sink);
    const e = scores.map((s, j) => (seen[j] ? Math.exp(s - top) : 0));
    const own = sink === null ? 0 : Math.exp(sink - top);
    const total = e.reduce((a, b) => a + b, own);
    return {dots, scaled, capped, scores, seen, weights: e.map((x) => x / total), sink: sink === null ? null : own / total};
  };

  function select(label, n, value, onchange, names) {
    const s = el("select", {"aria-label": label, onchange: (ev) => onchange(ev.target.value)},
      ...Array.from({length: n}, (_, k) => el("option", {value: names ? k : k + 1, text: names ? names[k] : `${label} ${k + 1}`})));
    s.value = String(value);
    return s;
  }

  const steps = () => ["qk", "dot", ...(st.data && st.data.bias ? ["bias"] : []), "softmax", "blend"];
  const shape = (info) => info.attentions[st.attention];

  function controls(info) {
    const attentions = Object.keys(AL.ATTENTIONS).filter((k) => info.attentions[k]);
    const reload = (key, num = true) => (v) => { st[key] = num ? Number(v) : v; if (key !== "layer" && key !== "head") st.query = -1; load(); };
    return el("div", {class: "controls"},
      attentions.length > 1 ? select("attention", attentions.length, attentions.indexOf(st.attention), (v) => reload("attention", false)(attentions[v]), attentions) : null,
      info.sentences.length > 1 ? select("sentence", info.sentences.length, st.sentence, reload("sentence"),
        info.sentences.map((x) => x.text)) : null,
      select("layer", shape(info).num_layers, st.layer, reload("layer")),
      select("head", shape(info).num_heads, st.head, reload("head")),
      ...steps().map((_, k) => el("button", {class: st.step === k + 1 ? "active" : "", text: `step ${k + 1}`,
        onclick: () => { st.step = k + 1; render(); }})));
  }

  function render() {
    const root = document.getElementById("view-neuron");
    const info = st.source && st.source.neuronInfo();
    if (!info) { root.replaceChildren(el("p", {class: "muted", text: "No sentence yet: type one above and press Show attention."})); return; }
    const d = st.data;
    const head = [controls(info)];
    if (st.error) { root.replaceChildren(...head, el("p", {class: "status error", text: st.error})); return; }
    if (!d) { root.replaceChildren(...head, el("p", {class: "muted", text: "loading…"})); return; }
    if (d.too_long) {
      root.replaceChildren(...head, el("p", {class: "muted",
        text: `This sentence has ${d.length} tokens; the neuron view keeps queries and keys of sentences up to ${d.max_tokens}.`}));
      return;
    }
    const names = steps();
    st.step = Math.min(st.step, names.length);
    const show = (name) => st.step >= names.indexOf(name) + 1;
    if (st.query < 0 || st.query >= d.labels.length) st.query = d.labels.length - 1;
    const i = st.query, q = d.q[i], meta = d.meta, cap = meta.softcap, win = meta.window;
    const bias = d.bias ? d.bias[i] : null;
    const row = AL.neuronRow(q, d.k, i, meta, bias, meta.sink_logits ? meta.sink_logits[st.head - 1] : null);
    const prods = d.k.map((k) => k.map((x, c) => x * q[c]));
    const vmax = Math.max(maxAbs(d.q), maxAbs(d.k)), pmax = maxAbs(prods);
    const cross = st.attention === "cross";
    const strip = el("div", {class: "strip"}, ...d.labels.map((t, j) =>
      el("span", {class: `word${j === i ? " chosen" : ""}`, "data-index": j, text: t, onclick: () => { st.query = j; render(); }})));
    const scaledHead = `× ${meta.scale.toPrecision(3)}` + (cap ? `, ${cap}·tanh(·/${cap})` : "");
    const th = (text, cls) => el("th", {text, class: cls});
    const table = el("table", {class: "scene neuron"},
      el("thead", {}, el("tr", {},
        th(cross ? "key (source)" : "key"), th("k"),
        show("dot") ? [th("q∘k"), th("q·k", "dot"), th(scaledHead, "scaled")] : null,
        bias && show("bias") ? [th("+ bias", "bias"), th("score", "score")] : null,
        show("softmax") ? [th("weight"), th("")] : null)),
      el("tbody", {}, ...d.k.map((k, j) => el("tr", {class: !cross && j === i ? "query" : "", "data-token": d.key_labels[j]},
        el("td", {text: d.key_labels[j]}), el("td", {}, bars(k, vmax)),
        show("dot") ? [el("td", {}, bars(prods[j], pmax)), el("td", {class: "num dot", text: row.dots[j].toFixed(2)}),
          el("td", {class: "num scaled", text: row.seen[j] || bias ? row.capped[j].toFixed(2) : "masked"})] : null,
        bias && show("bias") ? [el("td", {class: "num bias", text: bias[j].toFixed(2)}),
          el("td", {class: "num score", text: row.seen[j] ? row.scores[j].toFixed(2) : "masked"})] : null,
        show("softmax") ? [el("td", {class: "bar"}, el("span", {class: "fill", style: `width:${(100 * row.weights[j]).toFixed(1)}%`})),
          el("td", {class: "num weight", text: AL.pct1(row.weights[j])})] : null))));
    const best = row.weights.map((w, j) => [w, j]).sort((a, b) => b[0] - a[0]).slice(0, 3);
    const about = `${cross ? "Cross-attention, " : st.attention === "decoder" ? "Decoder, " : ""}layer ${st.layer}, head ${st.head}; ` +
      `scale ${meta.scale.toPrecision(3)}` + (meta.causal ? ", causal" : "") + (win ? `, sliding window ${win[0] + 1}` : "") +
      (cap ? `, softcap ${cap}` : "") + (d.bias ? ", position bias" : "") +
      (row.sink === null ? "" : ", learned sink") + " · token level";
    root.replaceChildren(...[
      ...head,
      el("p", {class: "lead", id: "neuron-step"}, `Step ${st.step}: ${STEPS[names[st.step - 1]]}. `, el("span", {class: "muted", text: about})),
      el("p", {class: "muted", text: cross ? "Click a target token to make it the query; the keys are the source's tokens."
        : "Click a word to make it the query."}),
      cross ? el("span", {class: "muted", text: "target (looks):"}) : null, strip,
      el("p", {}, el("b", {id: "neuron-query", text: `q(${d.labels[i]}) `}), bars(q, vmax)),
      table,
      row.sink !== null && show("softmax") ? el("p", {id: "neuron-sink", class: "muted", text: `The learned sink (logit ` +
        `${meta.sink_logits[st.head - 1].toFixed(2)}) takes ${AL.pct1(row.sink)} of the softmax and blends no value: ` +
        `the weights add up to ${AL.pct1(1 - row.sink)}.`}) : null,
      show("blend") ? el("p", {class: "lead", text: `The weights blend the values: ${best.map(([w, j]) =>
        `${AL.pct(w)} of ${d.key_labels[j]}`).join(", ")}… (values are not kept; the head view shows every row).`}) : null,
    ].filter(Boolean));
  }

  async function load() {
    const info = st.source && st.source.neuronInfo();
    st.data = null;
    st.error = null;
    if (info) {
      if (!info.attentions[st.attention]) st.attention = "encoder";
      st.sentence = Math.min(st.sentence, info.sentences.length - 1);
      st.layer = Math.min(st.layer, shape(info).num_layers);
      st.head = Math.min(st.head, shape(info).num_heads);
    }
    render();
    if (!info) return;
    const ticket = ++st.ticket;
    try {
      const data = await st.source.neuron(st.sentence, st.layer, st.head, st.attention);
      if (ticket !== st.ticket) return; // a later choice won
      st.data = data;
    } catch (e) {
      if (ticket !== st.ticket) return;
      st.error = e.message;
    }
    render();
  }

  AL.on("maps", ({source}) => {
    st.source = source;
    Object.assign(st, {sentence: 0, query: -1});
    if (st.started) load();
  });

  AL.neuron = {
    show(source) {
      st.source = source;
      st.started = true;
      load();
    },
    current: () => st.data && !st.data.too_long ? {...st.data, query: st.query, attention: st.attention} : null,
  };
})();
