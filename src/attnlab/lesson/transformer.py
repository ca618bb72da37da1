"""Section 8 of the lesson: the transformer around attention, and a head being learned.

A 2-layer attention-only causal transformer, built from attnlab's parts
(:class:`attnlab.transformer.Transformer`, attention by the ``blockwise`` backend and its
FlashAttention-2 backward), is trained on the CPU on random tokens in which a random segment
repeats at a random offset, so only copying can predict the repeat and position alone cannot.
The section shows the loss on the repeated part over the steps (the sudden drop of Olsson et al.
2022), the maps of every head before and after, the roles found (a previous-token head in layer 1,
an induction head in layer 2, with their scores), what knocking them out does to the loss, and the
circuit proved by patching (:mod:`attnlab.lesson.circuit`): which head's output carries the copying,
and that the previous-token head reaches the induction head through its keys.

The set-up. With learned absolute positions, an induction head can form in layer 2 without a
previous-token head in layer 1: with positions in the residual stream a layer-1 head can find the
earlier copy of the current token and carry *its position* forward, and layer 2 then looks one
position further by position alone. Two choices bring out the textbook circuit. Rotary positions
turn only q and k, so no position enters the residual stream and that route is closed: layer 2 can
find "the token after the earlier copy" only if layer 1 has written each token's predecessor into
it (a previous-token head, read through layer 2's keys: K-composition). Repeats of 16–24 of the 48 tokens make a third or more of the targets copyable, so the
copying signal is strong and the plateau before the drop is short.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from attnlab.analysis.induction import induction_score, source_pattern
from attnlab.lesson.circuit import (
    SEQUENCES,
    circuit,
    circuit_findings,
    circuit_tables,
    corrupt,
)
from attnlab.lesson.fmt import num
from attnlab.maps.heads import Head
from attnlab.lesson.section import Section, table
from attnlab.maps.heads import Head

KEY, NUMBER = "transformer", 8
# The lesson says an induction head "has formed" when the best layer-2 head puts half of its weight on
# the token after the earlier copy (the role's threshold, analysis.roles.INDUCTION_THRESHOLD, is lower:
# a head has the role; here the circuit is learned).
INDUCTION_FORMED_THRESHOLD = 0.5


@dataclass(frozen=True)
class InductionConfig:
    """The training set-up (the module docstring says why these). ``threads``: torch's CPU threads
    while training, fixed so a seed gives the same run on a machine whatever its core count."""

    vocab: int = 64
    seq_len: int = 48
    segment: tuple[int, int] = (16, 24)
    d_model: int = 64
    heads: int = 4
    batch: int = 32
    steps: int = 400
    lr: float = 3e-3
    eval_every: int = 25
    eval_batch: int = 64
    backend: str = "blockwise"
    threads: int = 1
    seed: int = 0


def repeats(rng: np.random.Generator, n: int, c: InductionConfig) -> tuple[Any, Any, Any]:
    """``n`` sequences of random tokens, each with one segment repeated at a random offset.

    Returns tokens (n, T); targets (n, T), true where the token is the 2nd… of the repeat (predictable
    by copying); source (n, T), for a query on the repeat the position of the token after its
    earlier copy (where an induction head looks), else −1.
    """
    import torch

    T, (lo, hi) = c.seq_len, c.segment
    x = rng.integers(0, c.vocab, size=(n, T))
    targets, source = np.zeros((n, T), bool), np.full((n, T), -1)
    for r in range(n):
        s = int(rng.integers(lo, hi + 1))  # segment length
        a = int(rng.integers(0, T - 2 * s + 1))  # first copy at a
        b = int(rng.integers(a + s, T - s + 1))  # the repeat at b, after the first copy
        x[r, b:b + s] = x[r, a:a + s]
        targets[r, b + 1:b + s] = True
        source[r, b:b + s - 1] = np.arange(a + 1, a + s)
    return torch.from_numpy(x), torch.from_numpy(targets), torch.from_numpy(source)


def head_scores(weights: tuple, source: Any) -> tuple[np.ndarray, np.ndarray]:
    """Previous-token and induction scores [L, H] from weights L × (B, H, T, T).

    previous-token: the mean weight of query t on key t − 1 (t ≥ 1); induction: the mean weight of a
    query on the repeat on the key after its earlier copy (Olsson et al. 2022).
    """
    src = source.numpy()
    pattern, rows = source_pattern(src[:, None], src.shape[-1]), (src >= 0)[:, None]  # (B, 1, T, T), (B, 1, T)
    prev = np.stack([w.diagonal(-1, -2, -1).mean((0, 2)).numpy() for w in weights])  # (L, H)
    ind = np.stack([induction_score(w.numpy(), pattern, rows, axis=(0,)) for w in weights])  # (L, H)
    return prev.astype(np.float64), ind


def _model(c: InductionConfig) -> Any:
    from attnlab.transformer.config import TransformerConfig
    from attnlab.transformer.model import Transformer

    config = TransformerConfig(vocab_size=c.vocab, d_model=c.d_model, num_layers=2, num_heads=c.heads, ffn="none",
                               positions="rotary", max_positions=c.seq_len, causal=True, bias=False,
                               tie_embeddings=False, family="induction")
    return Transformer(config, backend=c.backend)


def _evaluate(net: Any, x: Any, targets: Any, source: Any, keep: Any = None) -> dict:
    import torch
    import torch.nn.functional as F

    from attnlab.interventions.ablation import knockout

    hooks = () if keep is None else knockout(net.config, keep)  # the heads knocked out at hook_z
    with torch.no_grad():  # the patterns are hooked: the model computes them with backend "torch"'s math
        logits, cache = net.run_with_cache(x, names=lambda n: n.endswith(".hook_pattern"), fwd_hooks=hooks,
                                           backend="torch")
        nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), x[:, 1:], reduction="none")  # (B, T−1)
        rep = float((nll * targets[:, 1:]).sum() / targets[:, 1:].sum())  # the loss on the repeat
    weights = tuple(cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(net.config.num_layers))
    prev, ind = head_scores(weights, source)
    return {"repeat_loss": rep, "previous_token": prev, "induction": ind, "weights": weights}


def train(c: InductionConfig = InductionConfig()) -> dict:
    """Train the model; returns the history, the maps of one sequence before and after, and the model."""
    import torch
    import torch.nn.functional as F

    threads = torch.get_num_threads()
    torch.set_num_threads(c.threads)
    try:
        torch.manual_seed(c.seed)
        rng, held_out = np.random.default_rng(c.seed), np.random.default_rng([c.seed, 1])
        ex, et, es = repeats(held_out, c.eval_batch, c)  # the same held-out sequences at every evaluation
        net = _model(c)
        opt = torch.optim.AdamW(net.parameters(), lr=c.lr, weight_decay=0.0)
        first = _evaluate(net, ex, et, es)
        history = {"step": [0], "seconds": [0.0], "train_loss": [], "repeat_loss": [first["repeat_loss"]],
                   "previous_token": [first["previous_token"].max(-1).tolist()],
                   "induction": [first["induction"].max(-1).tolist()]}
        train_s, train_cpu, last = 0.0, 0.0, first
        for step in range(1, c.steps + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            x, _, _ = repeats(rng, c.batch, c)
            logits = net.logits(net(x))[:, :-1]  # (B, T−1, V): each position predicts the next token
            loss = F.cross_entropy(logits.reshape(-1, c.vocab), x[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            train_s += time.perf_counter() - t0
            train_cpu += time.process_time() - c0
            history["train_loss"].append(loss.item())
            if step % c.eval_every == 0 or step == c.steps:
                last = _evaluate(net, ex, et, es)
                history["step"].append(step)
                history["seconds"].append(train_s)
                history["repeat_loss"].append(last["repeat_loss"])
                history["previous_token"].append(last["previous_token"].max(-1).tolist())  # best head of each layer
                history["induction"].append(last["induction"].max(-1).tolist())
    finally:
        torch.set_num_threads(threads)
    return {"net": net, "history": history, "train_seconds": train_s, "train_cpu_seconds": train_cpu,
            "before": first, "after": last,
            "eval": (ex, et, es)}


def _ablations(net: Any, ex: Any, et: Any, es: Any, prev_head: int, ind_head: int, heads: int) -> dict:
    """The loss on the repeat with the roles' heads knocked out (zeroed), one at a time and together."""
    import torch

    out = {}
    for name, knocked in (("none", []), ("induction_head", [(1, ind_head)]), ("previous_token_head", [(0, prev_head)]),
                          ("both", [(0, prev_head), (1, ind_head)])):
        keep = torch.ones(2, heads)
        for layer, head in knocked:
            keep[layer, head] = 0.0
        out[name] = _evaluate(net, ex, et, es, keep)["repeat_loss"]
    return out


def _circuit(net: Any, c: InductionConfig) -> dict:
    """Patching and path patching on fresh sequences of the training kind (their own seed): lesson.json's ``circuit``."""
    rng = np.random.default_rng([c.seed, 2])
    x, targets, source = repeats(rng, SEQUENCES, c)
    return circuit(net, x, targets, source, corrupt(rng, x, source, c.vocab))


def _maps(weights: tuple, i: int = 0) -> list:
    """Every head's map of held-out sequence ``i``, [L][H][T][T], rounded for lesson.json."""
    return [np.round(w[i].numpy().astype(np.float64), 4).tolist() for w in weights]


def _tables(c: InductionConfig, run: dict, losses: dict, prev_head: int, ind_head: int) -> tuple:
    """The section's tables of training: the curve, every head's scores, the knock-outs."""
    h, before, after = run["history"], run["before"], run["after"]
    score_rows = [[str(Head(layer, head)), num(before["previous_token"][layer, head], 2),
                   num(after["previous_token"][layer, head], 2), num(before["induction"][layer, head], 2),
                   num(after["induction"][layer, head], 2)]
                  for layer in range(2) for head in range(c.heads)]
    curve_rows = [[s, f"{t:.1f}", f"{r:.2f}", f"{p[0]:.2f}", f"{i[1]:.2f}"]
                  for s, t, r, p, i in zip(h["step"], h["seconds"], h["repeat_loss"], h["previous_token"],
                                           h["induction"]) if s % 100 == 0 or s == c.steps]
    return (
        table("The loss on the repeat and the best scores over training",
              ["step", "seconds", "loss on the repeat (nats)", "best previous-token score, layer 1",
               "best induction score, layer 2"], curve_rows),
        table("Every head's scores, before and after training",
              ["head", "previous-token before", "previous-token after", "induction before", "induction after"],
              score_rows),
        table("The loss on the repeat with heads knocked out (zeroed)", ["heads out", "loss (nats)"],
              [["none", f"{losses['none']:.2f}"],
               [f"the induction head ({Head(1, ind_head)})", f"{losses['induction_head']:.2f}"],
               [f"the previous-token head ({Head(0, prev_head)})", f"{losses['previous_token_head']:.2f}"],
               ["both", f"{losses['both']:.2f}"]]),
    )


def transformer_section(seed: int = 0, config: InductionConfig | None = None) -> Section:
    c = config or InductionConfig(seed=seed)
    run = train(c)
    h, before, after = run["history"], run["before"], run["after"]
    ex, et, es = run["eval"]
    prev_head = int(after["previous_token"][0].argmax())  # 0-based head of layer 1
    ind_head = int(after["induction"][1].argmax())  # 0-based head of layer 2
    prev_score, ind_score = float(after["previous_token"][0, prev_head]), float(after["induction"][1, ind_head])
    losses = _ablations(run["net"], ex, et, es, prev_head, ind_head, c.heads)
    reached = [(s, t) for s, t, i in zip(h["step"], h["seconds"], h["induction"]) if i[1] >= INDUCTION_FORMED_THRESHOLD]
    step_at, seconds_at = reached[0] if reached else (None, None)
    chance = math.log(c.vocab)
    findings = (
        f"The model: {c.d_model}-wide, 2 layers of {c.heads} heads, attention only, rotary positions, every "
        f"attention through attnlab.attention (backend {c.backend!r}, trained through its FlashAttention-2 backward). "
        f"The data: {c.seq_len} random tokens of {c.vocab}, with a segment of {c.segment[0]}–{c.segment[1]} tokens "
        f"repeated at a random offset, so only copying predicts the repeat.",
        f"The loss on the repeat stayed near chance (ln {c.vocab} = {chance:.2f} nats) and then dropped: "
        + (f"the best layer-2 head's induction score passed {INDUCTION_FORMED_THRESHOLD} at step {step_at} after "
           f"{seconds_at:.1f} s of training; " if reached else "no head reached the induction threshold; ")
        + f"after {c.steps} steps ({run['train_seconds']:.1f} s) the loss on the repeat is {losses['none']:.2f} nats.",
        f"The roles found: layer 1, head {prev_head + 1} is a previous-token head (score {prev_score:.2f}: its share of "
        f"weight on the token just before); layer 2, head {ind_head + 1} is an induction head (score {ind_score:.2f}: "
        f"its share on the token after the earlier copy). Rotary positions leave no position in the residual stream, "
        f"so layer 2 can find that token only through what layer 1 wrote: the textbook circuit.",
        f"Knocking the induction head out brings the loss on the repeat back up from {losses['none']:.2f} to "
        f"{losses['induction_head']:.2f} nats; knocking out the previous-token head, which layer 2 reads, gives "
        f"{losses['previous_token_head']:.2f}; both, {losses['both']:.2f}. A map shows where a head looks; the "
        f"ablation shows the model needs it.",
    )
    circ = _circuit(run["net"], c)
    findings += circuit_findings(circ, Head(1, ind_head).to_dict(), Head(0, prev_head).to_dict())
    tables = _tables(c, run, losses, prev_head, ind_head) + circuit_tables(circ)
    data = {
        "config": dict(asdict(c), segment=list(c.segment)),
        "induction_score": ind_score,
        "previous_token_score": prev_score,
        "induction_head": Head(1, ind_head).to_dict(),  # 0-based, as every field
        "previous_token_head": Head(0, prev_head).to_dict(),
        "train_seconds": run["train_seconds"],
        "train_cpu_seconds": run["train_cpu_seconds"],
        "steps_to_induction": step_at,
        "seconds_to_induction": seconds_at,
        "chance_loss": chance,
        "loss_with_induction_head": losses["none"],
        "loss_without_induction_head": losses["induction_head"],
        "loss_without_previous_token_head": losses["previous_token_head"],
        "loss_without_both": losses["both"],
        "history": h,
        "scores": {"previous_token": {"before": before["previous_token"].tolist(),
                                      "after": after["previous_token"].tolist()},
                   "induction": {"before": before["induction"].tolist(), "after": after["induction"].tolist()}},
        "example": {"tokens": ex[0].tolist(), "repeat": et[0].tolist(), "source": es[0].tolist()},
        "maps": {"before": _maps(before["weights"]), "after": _maps(after["weights"])},
        "circuit": circ,
    }
    return Section(KEY, NUMBER, "The transformer around attention: an induction head being learned", findings, tables,
                   data)
