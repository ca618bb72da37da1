"""The lesson's figures other than heatmaps (those are :mod:`attnlab.viz.heatmap`).

Each function takes the ``data`` of one lesson section (plain lists and numbers, as in
``lesson.json``) and returns a matplotlib ``Figure`` built without pyplot, so nothing depends on
a display or on global state; the caller saves it.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from attnlab.viz.heatmap import heatmap_grid

UNSCALED, SCALED = "#c44e52", "#4c72b0"  # one colour per variant, the same in every figure


def _bars(ax, labels, series: dict[str, list[float]], colors: list[str], percent: bool = True) -> None:
    """Grouped bars: one group per label, one bar per series."""
    x = np.arange(len(labels))
    width = 0.8 / len(series)
    for i, ((name, values), color) in enumerate(zip(series.items(), colors)):
        vals = np.asarray(values) * (100 if percent else 1)
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, vals, width, label=name, color=color)
        if percent:
            ax.bar_label(bars, labels=[f"{round(v)}" for v in vals], fontsize=7, padding=1)
    ax.set_xticks(x, labels)
    ax.legend(frameon=False, fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)


def scene_weights(data: dict) -> Figure:
    """Section 1: the weights of "bank" over the sentence, unscaled and scaled by 1/√2."""
    fig = Figure(figsize=(7, 3.2), layout="constrained")
    ax = fig.add_subplot()
    _bars(ax, data["tokens"], {"unscaled (the scene)": data["unscaled"]["weights"],
                               "scaled by 1/√2": data["scaled"]["weights"]}, [UNSCALED, SCALED])
    ax.set_ylabel("weight (%)")
    ax.set_title('Where "bank" looks: softmax of q·k')
    return fig


def dot_vs_additive(data: dict) -> Figure:
    """Section 2: the weights of query x1 under the dot product and under Bahdanau's additive score."""
    dva = data["dot_vs_additive"]
    labels = [f"y{j + 1}" for j in range(len(dva["dot_weights"][0]))]
    fig = Figure(figsize=(6, 3), layout="constrained")
    ax = fig.add_subplot()
    _bars(ax, labels, {"dot product s·h/√d": dva["dot_weights"][0], "additive vᵀtanh(Ws + Uh)": dva["additive_weights"][0]},
          ["#55a868", "#8172b2"])
    ax.set_ylabel("weight of x1 (%)")
    ax.set_title("Same inputs, two scores, the same softmax")
    return fig


def scaling(data: dict) -> Figure:
    """Section 3: std of q·k against d; the largest weight per draw; the softmax slope against the scale."""
    fig = Figure(figsize=(11, 3.3), layout="constrained")
    a, b, c = fig.subplots(1, 3)
    d = np.array([r["d"] for r in data["std"]])
    a.loglog(d, [r["std"] for r in data["std"]], "o", color=UNSCALED, label="std of q·k")
    a.loglog(d, np.sqrt(d), "-", color="0.6", lw=1, label="√d")
    a.loglog(d, [r["std_scaled"] for r in data["std"]], "s", color=SCALED, label="std of q·k / √d")
    a.set_xlabel("d"), a.set_title("q·k grows as √d"), a.legend(frameon=False, fontsize=8)

    sat = data["saturation"]
    bins = np.linspace(0, 1, 21)
    b.hist(sat["largest_unscaled"], bins, color=UNSCALED, alpha=0.7, label=f"unscaled, mean {sat['unscaled_mean']:.2f}")
    b.hist(sat["largest_scaled"], bins, color=SCALED, alpha=0.7, label=f"scaled, mean {sat['scaled_mean']:.2f}")
    b.set_xlabel(f"largest of {sat['keys']} weights (d_k = {sat['d_k']})"), b.set_ylabel("draws")
    b.set_title(f"Saturation over {sat['draws']} draws"), b.legend(frameon=False, fontsize=8)

    g = data["gradient"]
    c.semilogx(g["factors"], g["jacobian_norm"], color="k", label="mean ‖∂α/∂s‖")
    c.semilogx(g["factors"], g["largest_weight"], color="0.6", ls="--", label="mean largest weight")
    for x, name, col in ((1.0, "scaled", SCALED), (8.0, "unscaled (×√64)", UNSCALED)):
        c.axvline(x, color=col, lw=1)
        c.text(x, 1.02, name, color=col, fontsize=8, ha="center", transform=c.get_xaxis_transform())
    c.set_xlabel("scale factor c on unit-variance scores"), c.set_ylim(0, 1.0)
    c.set_title("The slope vanishes as scores grow", pad=14), c.legend(frameon=False, fontsize=8, loc="center left")
    for ax in (a, b, c):
        ax.spines[["top", "right"]].set_visible(False)
    return fig


def head_costs(data: dict) -> Figure:
    """Section 4: multiply-adds of one layer, split by step, for each configuration."""
    m = data["model"]
    short = m["model_id"].rsplit("/", 1)[-1]  # "all-MiniLM-L6-v2", not its hub owner
    rows = [("1 head\nof 512", data["one_head_512"]), ("8 heads\nof 64", data["eight_heads_512"]),
            ("BERT base\n12 heads of 64", data["bert_base"]), (f"{short}\n{m['num_heads']} heads of {m['d_head']}", m["cost"])]
    parts = (("projections", "Q, K, V = XW"), ("scores", "QKᵀ"), ("weighted_sum", "αV"), ("output", "Wᴼ"))
    colors = ("#4c72b0", "#dd8452", "#55a868", "#8172b2")
    fig = Figure(figsize=(8, 3.8), layout="constrained")
    ax = fig.add_subplot()
    bottom = np.zeros(len(rows))
    for (key, label), color in zip(parts, colors):
        vals = np.array([r[key] for _, r in rows]) / 1e6
        ax.bar(range(len(rows)), vals, bottom=bottom, label=label, color=color, width=0.6)
        bottom += vals
    ax.set_xticks(range(len(rows)), [name for name, _ in rows], fontsize=9)
    ax.set_ylabel(f"million multiply-adds per layer (n = {data['n']})")
    ax.set_title("Heads split d_model: the arithmetic stays the same")
    ax.legend(frameon=False, fontsize=8, loc="upper left")
    ax.spines[["top", "right"]].set_visible(False)
    return fig


def cost_curves(data: dict) -> Figure:
    """Section 6: measured time and peak memory against n (log-log), with the user's limits."""
    cfg = data["config"]
    fig = Figure(figsize=(10, 4.6), layout="constrained")
    a, b = fig.subplots(1, 2)
    for (name, p), color in zip(data["paths"].items(), ("#4c72b0", "#55a868", "#8172b2", "#dd8452")):
        sweep = sorted(p["points"], key=lambda r: r["n"])
        extra = [r for r in p["largest_context"]["tried"] if r["measured"] and r["n"] not in {q["n"] for q in sweep}]
        for ax, key, scale, exp in ((a, "time_s", 1000, p["time_exponent"]), (b, "peak_bytes", 1e-6, p["memory_exponent"])):
            ax.loglog([r["n"] for r in sweep], [r[key] * scale for r in sweep], "o-", color=color,
                      label=f"{name}: ∝ n^{exp:.2f}")
            if extra:
                ax.loglog([r["n"] for r in extra], [r[key] * scale for r in extra], "o", mfc="none", color=color,
                          label="search for the largest n")
            if p["largest_context"]["n"]:
                ax.axvline(p["largest_context"]["n"], color=color, ls=":", lw=1)
    a.axhline(cfg["deadline_ms"], color=UNSCALED, lw=1, label=f"deadline {cfg['deadline_ms']:g} ms")
    b.axhline(cfg["memory_mb"], color=UNSCALED, lw=1, label=f"budget {cfg['memory_mb']:g} MB")
    a.set_ylabel("time (ms)"), b.set_ylabel("peak extra memory (MB)")
    a.set_title(f"Time as n doubles (d = {cfg['d']})"), b.set_title("Memory as n doubles")
    ticks = sorted({r["n"] for p in data["paths"].values() for r in p["points"]})
    for ax in (a, b):
        ax.set_xticks(ticks, [str(n) for n in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("context n (tokens)")
        # Below the axes: inside, the legend covers the search points wherever it goes.
        ax.legend(frameon=False, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncols=2)
        ax.spines[["top", "right"]].set_visible(False)
    return fig


def _words_panel(m: dict) -> dict:
    return {"weights": m["weights"], "rows": m["words"], "cols": m["words"], "title": m["title"]}


def qkv_maps(data: dict) -> Figure:
    """Section 2: head 1 of self-attention (4 × 4) and of cross-attention (4 × 6)."""
    xs = [f"x{i + 1}" for i in range(len(data["x"]))]
    ys = [f"y{j + 1}" for j in range(len(data["other"]))]
    return heatmap_grid([
        {"weights": data["self"]["weights"][0], "rows": xs, "cols": xs, "title": "self-attention, head 1"},
        {"weights": data["cross"]["weights"][0], "rows": xs, "cols": ys, "title": "cross-attention, head 1"},
        {"weights": data["listing"]["weights"], "rows": ["1", "2", "3"], "cols": ["1", "2", "3"],
         "title": "the book's listing, head 1 (k_d = 1)"},
    ])


def bank_head(data: dict) -> Figure:
    """Section 5: the "bank" head (best, or closest when none qualifies) on both sentences."""
    target = data["target"]
    maps = [m for m in data["heatmaps"] if m["title"].startswith(f'"{target}"')]
    return heatmap_grid([dict(_words_panel(m), title=f"sentence {m['sentence'] + 1}",
                              highlight=[i for i, w in enumerate(m["words"]) if w.lower() == target.lower()])
                         for m in maps], title=maps[0]["title"])


def role_heads(data: dict) -> Figure:
    """Section 5: the heads with the largest average weight on the previous word, the next word, the marks."""
    maps = [m for m in data["heatmaps"] if not m["title"].startswith(f'"{data["target"]}"')]
    # Two a row at the page's width: three a row drew the cell numbers at a third of their size.
    return heatmap_grid([_words_panel(m) for m in maps], ncols=2, shared_scale=True)


def next_maps(data: dict) -> Figure:
    """Section 7: weights before and after shuffling, the causal mask, a hidden token (head 1)."""
    tokens, ob = data["tokens"], data["order_blindness"]
    shuffled = [tokens[i] for i in ob["permutation"]]
    return heatmap_grid([
        {"weights": ob["weights"], "rows": tokens, "cols": tokens, "title": "in order"},
        {"weights": ob["weights_shuffled"], "rows": shuffled, "cols": shuffled, "title": "shuffled: same weights, permuted"},
        {"weights": data["causal"]["weights"], "rows": data["causal"]["tokens"], "cols": data["causal"]["tokens"],
         "title": "causal mask"},
        {"weights": data["hidden"]["weights"], "rows": tokens, "cols": tokens, "title": f'"{data["hidden"]["word"]}" hidden'},
    ], ncols=2)
