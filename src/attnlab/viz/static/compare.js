// Compare: two sentences side by side for one target word (the lesson's "bank" pair) with the
// result of the head search: which heads put the target's largest weight on the word that decides
// its meaning in every sentence, the best of them, and the target's row in that head, per sentence.
"use strict";
(function () {
  const AL = window.attnlab;
  const el = AL.el;
  const st = {source: null, editable: false, request: {
    sentences: ["I sat on the bank of the river.", "I put the money in the bank."],
    target: "bank", deciders: ["river", "money"], exclude_self: false, exclude_marks: false,
  }};

  function form() {
    const r = st.request;
    const input = (id, value, size) => el("input", {id, value, size});
    return el("form", {id: "compare-form", class: "controls", onsubmit: (e) => { e.preventDefault(); run(); }},
      el("label", {}, "Sentence 1 ", input("compare-a", r.sentences[0], 36)),
      el("label", {}, "decided by ", input("compare-da", r.deciders[0], 8)),
      el("label", {}, "Sentence 2 ", input("compare-b", r.sentences[1], 36)),
      el("label", {}, "decided by ", input("compare-db", r.deciders[1], 8)),
      el("label", {}, "Target ", input("compare-target", r.target, 8)),
      el("label", {title: "leave the target itself out of the argmax"},
        el("input", {type: "checkbox", id: "compare-exclude-self", checked: r.exclude_self}), " not the target itself"),
      el("label", {title: "leave the special tokens and punctuation out of the argmax"},
        el("input", {type: "checkbox", id: "compare-exclude-marks", checked: r.exclude_marks}), " not the marks"),
      el("button", {id: "compare-run", type: "submit", text: "Find the heads"}),
      el("span", {id: "compare-status", class: "status", role: "status"}));
  }

  function rowChart(side) {
    const order = side.words.map((_, j) => j);
    return el("div", {class: "side"},
      el("h3", {text: side.sentence}),
      el("table", {class: "row"}, el("tbody", {}, order.map((j) => el("tr", {
        class: `${j === side.target_index ? "query" : ""}${j === side.decider_index ? " decider" : ""}`},
      el("td", {text: side.words[j]}),
      el("td", {class: "bar"}, el("span", {class: "fill", style: `width:${(100 * side.row[j]).toFixed(1)}%`})),
      el("td", {class: "num pct", text: AL.pct(side.row[j])}))))));
  }

  function show(res) {
    const root = document.getElementById("compare-result");
    if (!res) { root.replaceChildren(el("p", {class: "muted", text: "No head search in this page."})); return; }
    const best = res.shown;
    root.replaceChildren(
      el("p", {id: "compare-summary", class: "lead", text: res.summary}),
      best ? el("p", {id: "compare-open", class: "link", text: `${best.qualifies ? "Best qualifying head" : "Closest head (none qualifies)"}: ` +
        `layer ${best.layer + 1}, head ${best.head + 1}. Click to open it in the Head view.`,
      onclick: () => AL.openHead({sentences: st.request.sentences, layer: best.layer + 1, head: best.head + 1})}) : null,
      best ? el("div", {class: "pair"}, best.sides.map(rowChart)) : null);
  }

  // Errors go next to the button the user pressed (the page's status line is hidden on this tab),
  // and the previous answer goes away, so it is never read as the answer to the new question.
  function say(text, isError) {
    const s = document.getElementById("compare-status");
    s.textContent = text;
    s.classList.toggle("error", !!isError);
  }

  async function run() {
    const v = (id) => document.getElementById(id).value.trim();
    const on = (id) => document.getElementById(id).checked;
    st.request = {sentences: [v("compare-a"), v("compare-b")], target: v("compare-target"), deciders: [v("compare-da"), v("compare-db")],
      exclude_self: on("compare-exclude-self"), exclude_marks: on("compare-exclude-marks")};
    const result = document.getElementById("compare-result");
    result.replaceChildren();
    if (![...st.request.sentences, st.request.target, ...st.request.deciders].every(Boolean)) {
      say("Fill in both sentences, the target word, and the word that decides its meaning in each sentence.", true);
      return;
    }
    say("searching the heads…");
    const button = document.getElementById("compare-run");
    button.disabled = true;
    try {
      show(await st.source.findHead(st.request));
      say("");
    } catch (e) {
      result.replaceChildren();
      say(e.message, true);
    } finally {
      button.disabled = false;
    }
  }

  AL.compare = {
    async init(source, editable) {
      st.source = source;
      st.editable = editable;
      const root = document.getElementById("view-compare");
      root.replaceChildren(editable ? form() : el("span"), el("div", {id: "compare-result"}));
      if (editable) return run();
      show(await source.findHead());
    },
  };
})();
