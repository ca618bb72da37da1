// Start-up: pick the data source (the embedded data of a self-contained page, or the local
// server's API), wire the tabs and the sentence form, and show the first view.
"use strict";
(function () {
  const AL = window.attnlab;
  const embedded = document.getElementById("attnlab-data");
  const data = embedded ? JSON.parse(embedded.textContent) : null;
  const source = data ? new AL.EmbeddedSource(data) : new AL.ServerSource();
  const available = {
    scene: !data || !!data.scene, head: !data || !!data.maps, model: !data || !!data.maps,
    compare: !data || !!data.search,
    neuron: !data || !!data.neuron, // the server's /api/neuron, or a page of capture(..., qk=True) maps
    rollout: !data || !!data.rollout, // the server's /api/rollout, or a page's rollout at residual 0.5
    generation: !data || !!data.generation, // the server's /api/generate (a decoder), or a page of `attnlab generate --html`
  };
  const started = new Set();
  let pairs = false; // the served model is an encoder–decoder: the boxes hold a source and a target

  AL.showView = function (name) {
    // Show the maps of one text (the model view colours the heads of the text it shows, so a circuit run on
  // another text first shows that text's maps); resolves to whether they are on show.
  AL.showText = async function (text) {
    document.getElementById("sentence-a").value = text;
    document.getElementById("sentence-b").value = "";
    await showMaps([text], document.getElementById("level").value);
    return !!(source.request && source.request.sentences.length === 1 && source.request.sentences[0] === text);
  };

  for (const b of document.querySelectorAll("#tabs button")) {
      b.hidden = !available[b.dataset.view];
      b.classList.toggle("active", b.dataset.view === name);
    }
    for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== `view-${name}`;
    document.getElementById("input").hidden = !!data || !["head", "model", "neuron", "rollout"].includes(name);
    if (started.has(name)) return;
    started.add(name);
    if (name === "scene") AL.scene.show(source).catch((e) => AL.status(e.message, true));
    if (name === "compare") AL.compare.init(source, !data);
    if (name === "neuron") AL.neuron.show(source);
    if (name === "rollout") AL.rollout.show(source);
    if (name === "generation") AL.generation.show(source, !data).catch((e) => AL.status(e.message, true));
  };

  async function showMaps(sentences, level) {
    AL.status("computing the maps…");
    document.getElementById("run").disabled = true;
    try {
      const t0 = performance.now();
      const maps = await source.maps(sentences, level);
      AL.emit("maps", {maps, source});
      AL.status(`${maps.model.id} · ${(performance.now() - t0).toFixed(0)} ms`);
    } catch (e) {
      AL.status(e.message, true);
    } finally {
      document.getElementById("run").disabled = false;
    }
  }

  // Open one head of some sentences in the head view (from the model view or Compare): the
  // server computes those sentences' maps first if they are not the ones on show.
  AL.openHead = async function ({sentences, layer, head}) {
    const current = source.request && source.request.sentences;
    if (!data && sentences && JSON.stringify(sentences) !== JSON.stringify(current)) {
      const boxes = pairs ? sentences[0].split("\t") : sentences; // an encoder–decoder's: source, target
      document.getElementById("sentence-a").value = boxes[0] || "";
      document.getElementById("sentence-b").value = boxes[1] || "";
      await showMaps(sentences, document.getElementById("level").value);
    }
    AL.emit("select-head", {sentence: 0, layer, head});
    AL.showView("head");
  };

  // Show the maps of one text (the model view colours the heads of the text it shows, so a circuit run on
  // another text first shows that text's maps); resolves to whether they are on show.
  AL.showText = async function (text) {
    document.getElementById("sentence-a").value = text;
    document.getElementById("sentence-b").value = "";
    await showMaps([text], document.getElementById("level").value);
    return !!(source.request && source.request.sentences.length === 1 && source.request.sentences[0] === text);
  };

  for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => AL.showView(b.dataset.view));
  document.getElementById("level").addEventListener("change", () => document.getElementById("input").requestSubmit());
  document.getElementById("input").addEventListener("submit", (e) => {
    e.preventDefault();
    const boxes = ["sentence-a", "sentence-b"].map((id) => document.getElementById(id).value.trim());
    const sentences = boxes.filter(Boolean);
    if (!sentences.length) {
      AL.status("Type a sentence in the box first, then press Show attention.", true);
      return;
    }
    if (pairs && sentences.length < 2) {
      AL.status("An encoder–decoder model reads a source and a target: type both, then press Show attention.", true);
      return;
    }
    showMaps(pairs ? [boxes.join("\t")] : sentences, document.getElementById("level").value);
  });

  const wanted = location.hash.slice(1);
  if (data) {
    if (data.maps) AL.emit("maps", {maps: data.maps, source});
    if (data.maps) document.getElementById("model-id").textContent = data.maps.model.id;
    AL.showView(available[wanted] ? wanted : data.maps ? "head" : data.generation ? "generation" : "scene");
  } else {
    AL.showView(available[wanted] ? wanted : "head");
    // An encoder–decoder takes one (source, target) pair, sent as "source<TAB>target": the two
    // boxes become the source and the target. The first maps wait for this answer.
    source.info().then((info) => {
      document.getElementById("model-id").textContent = info.model_id;
      if (info.encoder_decoder) {
        pairs = true;
        document.getElementById("label-a").textContent = "Source";
        document.getElementById("label-b").textContent = "Target";
        const b = document.getElementById("sentence-b");
        if (!b.value) b.value = document.getElementById("sentence-a").value;
      }
    }).catch((e) => AL.status(e.message, true)).finally(() => document.getElementById("input").requestSubmit());
  }
})();
