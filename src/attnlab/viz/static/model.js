// The Model view: every layer x head as a small map, with role badges (previous word, next word,
// marks, broad) from the role scores; click a map to open it in the Head view. Large inputs are
// drawn from the downsampled maps the data carry (`overview`), never from the full n x n maps.
"use strict";
(function () {
  const AL = window.attnlab;
  const el = AL.el;
  const st = {maps: null, sentence: 0};

  function badgesFor(layer, head) {
    return (st.maps.roles.badges || []).filter((b) => b.layer === layer - 1 && b.head === head - 1); // 0-based data
  }

  function render() {
    const root = document.getElementById("view-model");
    const m = st.maps;
    if (!m) { root.replaceChildren(el("p", {class: "muted", text: "No maps yet."})); return; }
    const s = m.sentences[st.sentence];
    const L = m.model.num_layers, H = m.model.num_heads;
    const cell = Math.max(40, Math.min(96, Math.floor(960 / H) - 8));
    const ov = s.overview;
    const legend = Object.entries(m.roles.legend || {}).map(([role, text]) =>
      el("span", {class: "legend"}, el("span", {class: `badge role-${role}`, text: role}), ` ${text}`));
    const grid = el("div", {id: "model-grid", class: "grid", style: `grid-template-columns: 3em repeat(${H}, ${cell + 4}px)`},
      el("span", {}), Array.from({length: H}, (_, h) => el("span", {class: "axis", text: `head ${h + 1}`})));
    for (let l = 1; l <= L; l++) {
      grid.append(el("span", {class: "axis", text: `layer ${l}`}));
      for (let h = 1; h <= H; h++) {
        const canvas = el("canvas", {});
        AL.drawMatrix(canvas, ov.maps[l - 1][h - 1], ov.size, cell);
        const badges = badgesFor(l, h);
        grid.append(el("button", {class: "cell", "data-layer": l - 1, "data-head": h - 1, // data: 0-based
          title: `layer ${l}, head ${h}` + badges.map((b) => `\n${b.role}: ${b.score.toFixed(2)}`).join(""),
          onclick: () => { AL.emit("select-head", {sentence: st.sentence, layer: l, head: h}); AL.showView("head"); }},
        canvas, el("span", {class: "badges"}, badges.map((b) => el("span", {class: `badge role-${b.role}`, text: b.role})))));
      }
    }
    const n = s.labels.length;
    root.replaceChildren(
      el("div", {class: "controls"},
        m.sentences.length > 1 ? el("label", {}, "Sentence ", el("select", {id: "model-sentence", class: "sentence-pick",
          title: s.text, onchange: (e) => { st.sentence = Number(e.target.value); render(); }},
        m.sentences.map((x, i) => el("option", {value: i, selected: i === st.sentence, text: `${i + 1}: ${x.text}`})))) : null,
        el("span", {class: "muted", text: `${L} layers × ${H} heads · ${n} ${m.level}s` +
          (ov.size < n ? ` · maps shown at ${ov.size} × ${ov.size} (averaged blocks)` : "")})),
      el("p", {class: "legends"}, legend), grid);
  }

  AL.on("maps", ({maps}) => { st.maps = maps; st.sentence = 0; render(); });
  AL.model = {render};
})();
