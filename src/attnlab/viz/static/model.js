// The Model view: every layer x head as a small map, with role badges (previous word, next word,
// marks, broad) from the role scores; click a map to open it in the Head view. Large inputs are
// drawn from the downsampled maps the data carry (`overview`), never from the full n x n maps.
// Served, the heads can be coloured by a circuit tool on texts typed here: activation patching
// (/api/patch: how much of the clean logit difference each head's output restores in the corrupted
// run) or direct logit attribution (/api/attribute: what each head writes into the logit). Each
// cell's frame takes AL.signed(value / m), m the largest magnitude over the heads, and shows the value.
// One text drives both: colouring a text first shows its maps, and colours stay only while their text
// is the one on show (a new sentence, another tool chosen or a failed run clears them).
"use strict";
(function () {
  const AL = window.attnlab;
  const el = AL.el;
  const st = {maps: null, sentence: 0, source: null, served: false, info: null, form: null, colour: null};
  const KINDS = {patch: "activation patching", attribute: "direct logit attribution"};

  function badgesFor(layer, head) {
    return (st.maps.roles.badges || []).filter((b) => b.layer === layer - 1 && b.head === head - 1); // 0-based data
  }

  // The circuit form, made once (what is typed stays across new maps), again when /api/info answers.
  function circuitForm() {
    if (!st.served) return null;
    if (st.form) return st.form;
    const refusal = st.info ? st.info.circuits.refusal : "asking the server what this model can do…";
    const off = !!refusal;
    const input = (id, size, value) => el("input", {id, size, value, disabled: off});
    const kind = el("select", {id: "circuit-kind", disabled: off}, Object.entries(KINDS).map(([k, text]) =>
      el("option", {value: k, text})));
    const corrupted = el("label", {id: "circuit-corrupted-label"}, "Corrupted ", input("circuit-corrupted", 28, "Set the file of the"));
    const clean = el("span", {id: "circuit-clean-name", text: "Clean "});
    kind.addEventListener("change", () => {
      corrupted.hidden = kind.value !== "patch";
      clean.textContent = kind.value === "patch" ? "Clean " : "Text ";
      if (st.colour) { st.colour = null; render(); } // the colours said the other tool
    });
    const form = el("form", {id: "circuit-form", class: "controls"},
      el("label", {}, "Colour the heads by ", kind),
      el("label", {}, clean, input("circuit-clean", 28, "Set the class of the")), corrupted,
      el("label", {}, "Target ", input("circuit-target", 8, " class")),
      el("label", {}, "Baseline (optional) ", input("circuit-baseline", 8, " file")),
      el("button", {id: "circuit-run", type: "submit", disabled: off, text: "Colour"}),
      el("button", {id: "circuit-clear", type: "button", disabled: off, text: "Clear",
        onclick: () => { st.colour = null; render(); }}),
      el("span", {id: "circuit-status", class: `status${off ? " error" : ""}`, role: "status", text: refusal || ""}));
    form.addEventListener("submit", (e) => { e.preventDefault(); run(); });
    st.form = form;
    return form;
  }

  async function run() {
    const value = (id) => document.getElementById(id).value;
    const kind = value("circuit-kind"), baseline = value("circuit-baseline") || null;
    const req = kind === "patch"
      ? {clean: value("circuit-clean"), corrupted: value("circuit-corrupted"), target: value("circuit-target"), baseline}
      : {text: value("circuit-clean"), target: value("circuit-target"), baseline};
    const button = document.getElementById("circuit-run"), status = document.getElementById("circuit-status");
    const text = kind === "patch" ? req.clean : req.text;
    button.disabled = true;
    status.classList.remove("error");
    status.textContent = `${KINDS[kind]}…`;
    if (st.colour) { st.colour = null; render(); } // nothing stale stays while this runs, or after it fails
    try {
      const t0 = performance.now();
      // One text drives both: the small maps are those of the text the heads are coloured for.
      if (shownText() !== text && !(await AL.showText(text))) throw new Error("the maps of this text could not be shown");
      const got = await st.source[kind](req);
      const top = Math.max(1e-9, ...got.heads.flat().map(Math.abs));
      st.colour = {kind, req, got, top, text};
      render();
      status.textContent = `${(performance.now() - t0).toFixed(0)} ms`;
    } catch (e) {
      status.textContent = e.message;
      status.classList.add("error");
    } finally {
      button.disabled = false;
    }
  }

  // What the colours mean, with their scale: red -m, white 0, blue m.
  function colourLegend() {
    const c = st.colour;
    if (!c) return null;
    const what = c.kind === "patch"
      ? `${KINDS.patch} of ${JSON.stringify(c.req.clean)} into ${JSON.stringify(c.req.corrupted)}: how much of the ` +
        `clean ${c.got.metric} each head's output restores (1 all of it; clean ${AL.num(c.got.clean)}, corrupted ${AL.num(c.got.corrupted)})`
      : `${KINDS.attribute} of ${JSON.stringify(c.req.text)}: what each head writes straight into the ${c.got.metric} ` +
        `(all components ${AL.num(c.got.total, 4)}, the model's ${AL.num(c.got.logit, 4)})`;
    const ramp = `linear-gradient(to right, ${AL.signed(-1)}, ${AL.signed(0)}, ${AL.signed(1)})`;
    return el("p", {id: "circuit-legend", class: "legends"}, el("span", {text: `Coloured by ${what}.`}),
      el("span", {class: "legend"}, el("span", {class: "num", text: AL.num(-c.top)}),
        el("span", {class: "ramp", style: `background: ${ramp}`}), el("span", {class: "num", text: AL.num(c.top)})));
  }

  function shownText() {
    return st.maps ? st.maps.sentences[st.sentence].text : null;
  }

  function cell(l, h, cellPx, ov) {
    const canvas = el("canvas", {});
    AL.drawMatrix(canvas, ov.maps[l - 1][h - 1], ov.size, cellPx);
    const badges = badgesFor(l, h);
    const c = st.colour, v = c ? c.got.heads[l - 1][h - 1] : null;
    const node = el("button", {class: c ? "cell coloured" : "cell", "data-layer": l - 1, "data-head": h - 1, // data: 0-based
      "data-value": c ? v : null,
      title: `layer ${l}, head ${h}` + badges.map((b) => `\n${b.role}: ${b.score.toFixed(2)}`).join("") +
        (c ? `\n${KINDS[c.kind]}: ${v.toFixed(4)}` : ""),
      onclick: () => { AL.emit("select-head", {sentence: st.sentence, layer: l, head: h}); AL.showView("head"); }},
    canvas, el("span", {class: "badges"}, badges.map((b) => el("span", {class: `badge role-${b.role}`, text: b.role}))),
    c ? el("span", {class: "value", text: AL.num(v)}) : null);
    if (c) node.style.background = AL.signed(v / c.top);
    return node;
  }

  function render() {
    const root = document.getElementById("view-model");
    const m = st.maps;
    if (!m) { root.replaceChildren(...[circuitForm(), el("p", {class: "muted", text: "No maps yet."})].filter(Boolean)); return; }
    const s = m.sentences[st.sentence];
    const L = m.model.num_layers, H = m.model.num_heads;
    const px = Math.max(40, Math.min(96, Math.floor(960 / H) - 8));
    const ov = s.overview;
    const legend = Object.entries(m.roles.legend || {}).map(([role, text]) =>
      el("span", {class: "legend"}, el("span", {class: `badge role-${role}`, text: role}), ` ${text}`));
    const grid = el("div", {id: "model-grid", class: "grid", style: `grid-template-columns: 3em repeat(${H}, ${px + (st.colour ? 14 : 4)}px)`},
      el("span", {}), Array.from({length: H}, (_, h) => el("span", {class: "axis", text: `head ${h + 1}`})));
    for (let l = 1; l <= L; l++) {
      grid.append(el("span", {class: "axis", text: `layer ${l}`}));
      for (let h = 1; h <= H; h++) grid.append(cell(l, h, px, ov));
    }
    const n = s.labels.length;
    root.replaceChildren(...[
      el("div", {class: "controls"},
        m.sentences.length > 1 ? el("label", {}, "Sentence ", el("select", {id: "model-sentence", class: "sentence-pick",
          title: s.text, onchange: (e) => { st.sentence = Number(e.target.value); forget(); render(); }},
        m.sentences.map((x, i) => el("option", {value: i, selected: i === st.sentence, text: `${i + 1}: ${x.text}`})))) : null,
        el("span", {class: "muted", text: `${L} layers × ${H} heads · ${n} ${m.level}s` +
          (ov.size < n ? ` · maps shown at ${ov.size} × ${ov.size} (averaged blocks)` : "")})),
      circuitForm(), colourLegend(), el("p", {class: "legends"}, legend), grid].filter(Boolean));
  }

  function forget() { // colours of a text no longer on show go
    if (st.colour && st.colour.text !== shownText()) st.colour = null;
  }

  AL.on("maps", ({maps, source}) => {
    const first = !st.source;
    Object.assign(st, {maps, sentence: 0, source, served: source instanceof AL.ServerSource});
    forget();
    render();
    if (first && st.served) {
      source.info().then((info) => { st.info = info; }, (e) => { st.info = {circuits: {refusal: e.message}}; })
        .then(() => { st.form = null; render(); });
    }
  });
  AL.model = {render, colour: () => st.colour};
})();
