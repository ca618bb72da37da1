"""Section 8's proof of the circuit: activation and path patching on the model it trained.

The scores say where the two heads look and the knock-outs that the model needs them; patching says
which activation *carries* the copying, and through which input. Clean sequences are the training
kind (a segment repeated); in the corrupted ones every token of the segment's first copy is replaced
by another, so the repeat has no earlier copy to look back at.

- Activation patching (:func:`attnlab.interventions.patching.patch`): each head's output from the
  clean run put into the corrupted one; the metric is the mean log-probability of the right next
  token on the repeat. The head that restores most is the head found.
- Path patching (:func:`attnlab.interventions.paths.path_patch`): each layer-1 head's clean output
  reaching only that head's queries, keys or values; the metric is the head's own attention on the
  token after the earlier copy (its induction pattern). A previous-token head read through the keys
  is K-composition (Elhage et al. 2021; Olsson et al. 2022). The values cannot move a pattern, so
  the effect through v is 0 by construction; the claim is about k against q.

Effects are normalised as patching's: (M − M_corrupted) / (M_clean − M_corrupted) on the batch means.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.maps.heads import Head

SEQUENCES = 32  # clean / corrupted pairs the patching averages over
INPUTS = ("q", "k", "v")


def corrupt(rng: np.random.Generator, x: Any, source: Any, vocab: int) -> Any:
    """``x`` (n, T) with every token of each repeat's first copy replaced by a different random token.

    The first copy is where ``source`` (the key after the earlier copy, −1 elsewhere) points, and one before."""
    import torch

    out = x.clone()
    for r in range(x.shape[0]):
        after = source[r][source[r] >= 0]  # a + 1 … a + s − 1
        first = torch.arange(int(after.min()) - 1, int(after.max()) + 1)  # a … a + s − 1
        shift = torch.from_numpy(rng.integers(1, vocab, size=len(first)))
        out[r, first] = (x[r, first] + shift) % vocab
    return out


def repeat_logprob(x: Any, targets: Any) -> Any:
    """The metric of activation patching: per sequence, the mean log-probability of the next token on the repeat."""
    import torch

    def metric(logits: Any) -> Any:
        logp = torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, x[:, 1:, None])[..., 0]  # (B, T − 1)
        scored = targets[:, 1:].double()
        return (logp * scored).sum(-1) / scored.sum(-1)
    return metric


def induction_attention(head: int, source: Any) -> Any:
    """The metric of path patching: per sequence, the mean weight layer 2's ``head`` puts on the token after
    the earlier copy, over the queries of the repeat (read from the patched run's ``hook_pattern``)."""
    rows = source >= 0  # (B, T)

    def metric(logits: Any, cache: dict) -> Any:
        w = cache["blocks.1.attn.hook_pattern"][:, head].double()  # (B, T, T)
        on = w.gather(-1, source.clamp(min=0)[..., None])[..., 0]  # (B, T)
        return (on * rows).sum(-1) / rows.sum(-1)
    return metric


def circuit(net: Any, x: Any, targets: Any, source: Any, corrupted: Any) -> dict:
    """Patching and path patching on ``net`` for clean sequences ``x`` (n, T) with their ``targets`` and
    ``source`` (as :func:`attnlab.lesson.transformer.repeats` gives them) and their ``corrupted`` copies
    (:func:`corrupt`): lesson.json's ``circuit`` entry.

    patching: [2, H] effects of each head's output; head: the layer-2 head that restores most; path:
    for every layer-1 head its effect through that head's q, k and v; sender: the layer-1 head of
    largest effect through k; k_over_qv: its k effect over the larger in size of its q and v effects."""
    from attnlab.interventions.patching import patch
    from attnlab.interventions.paths import path_patch

    grid = patch(net, x, corrupted, repeat_logprob(x, targets), backend="torch")
    found = Head(1, int(grid.effect[1].argmax()))
    attention = induction_attention(found.head, source)
    path = {which: path_patch(net, x, corrupted, attention, receiver=(*found, which), backend="torch",
                              names=["blocks.1.attn.hook_pattern"]) for which in INPUTS}
    effects = {which: path[which].effect[0].tolist() for which in INPUTS}  # layer-1 heads, through each input
    sender = Head(0, int(np.argmax(effects["k"])))
    k, other = effects["k"][sender.head], max(abs(effects["q"][sender.head]), abs(effects["v"][sender.head]))
    return {
        "sequences": int(x.shape[0]),
        "patching": {"effect": grid.effect.tolist(), "metric": "mean log-probability of the next token on the repeat",
                     "clean": float(grid.clean.mean()), "corrupted": float(grid.corrupted.mean())},
        "head": found.to_dict(),
        "path": {**effects, "metric": "the head's attention on the token after the earlier copy",
                 "clean": float(path["k"].clean.mean()), "corrupted": float(path["k"].corrupted.mean())},
        "sender": sender.to_dict(),
        "k_over_qv": None if other == 0 else k / other,
    }


def circuit_findings(d: dict, induction_head: dict, previous_head: dict) -> tuple[str, str]:
    """The two findings the section states about the circuit, in plain words (1-based heads for people)."""
    g, p = np.asarray(d["patching"]["effect"]), d["path"]
    head, sender, prev = Head(**d["head"]), Head(**d["sender"]), Head(**previous_head)
    others = np.delete(g.ravel(), head.layer * g.shape[1] + head.head)
    agrees = "the same head the scores named" if d["head"] == induction_head else \
        f"not the head the scores named ({Head(**induction_head).label()})"
    patching = (
        f"Which head carries the copying? Corrupt the input (every token of the first copy replaced, so the repeat "
        f"has nothing to look back at) and put one head's output back from the clean run at a time: {head.label()} "
        f"restores {g[head]:.0%} of the log-probability lost on the repeat, {agrees}; no other head restores more "
        f"than {others.max():.0%}" + (", though other layer-2 heads copy too" if others.max() > g[head] / 2 else "")
        + "." + (f" Putting back the previous-token head's output alone makes it worse ({g[prev]:.0%}), "
                 f"as the circuit would have it: the induction head can find the position after the earlier copy "
                 f"again, but the token there is still the replaced one." if g[prev] < 0 else ""))
    s = sender.head
    ratio = "" if d["k_over_qv"] is None else f" ({d['k_over_qv']:.1f} times the larger of the other two)"
    verdict = "its keys" if d["k_over_qv"] is not None and d["k_over_qv"] >= 3 else "mostly its keys" \
        if p["k"][s] > max(abs(p["q"][s]), abs(p["v"][s])) else "not mainly its keys"
    named = "the previous-token head" if d["sender"] == previous_head else "not the previous-token head the scores named"
    path = (
        f"Through which input? Let each layer-1 head's clean output reach only {head.label()}'s queries, keys or "
        f"values, and measure that head's attention on the token after the earlier copy: {sender.label()} ({named}) "
        f"restores {p['k'][s]:.0%} of it through the keys{ratio}, {p['q'][s]:.0%} through the queries and "
        f"{p['v'][s]:.0%} through the values (which cannot move a pattern). The earlier layer works through "
        f"{verdict}" + (": the induction head finds the token after the earlier copy because the previous-token head "
                        "wrote, at each position, which token came before it (K-composition)."
                        if verdict != "not mainly its keys" else "."))
    return patching, path


def circuit_tables(d: dict) -> tuple:
    """The patching grid and the path effects as tables (1-based labels, for people)."""
    from attnlab.lesson.section import table

    g, p, head = np.asarray(d["patching"]["effect"]), d["path"], Head(**d["head"])
    heads = range(g.shape[1])
    return (
        table("Activation patching: the share of the log-probability on the repeat each head's clean output restores",
              ["layer", *(f"head {h + 1}" for h in heads)],
              [[f"layer {layer + 1}", *(f"{g[layer, h]:.0%}" for h in heads)] for layer in range(g.shape[0])]),
        table(f"Path patching into {head.label()}: each layer-1 head's effect on its attention to the token after "
              "the earlier copy, through its queries, keys and values",
              ["layer-1 head", "through q", "through k", "through v"],
              [[str(Head(0, h)), *(f"{p[w][h]:.1%}" for w in INPUTS)] for h in heads]),  # compact in cells
    )
