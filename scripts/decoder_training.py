"""What attnlab's bundled decoders share in their training (``train_decoder.py``, ``train_decoder_long.py``):
the byte-level BPE tokenizer, the token stream, GPT-2's initialisation, the AdamW loop with warmup and
a cosine decay to the step budget, the held-out figures, and the folder transformers reads (Llama's
tensor names and config, float16 weights). Each script keeps its own corpus and model size.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

EOS = "<|endoftext|>"


def train_tokenizer(texts: list[str], vocab: int):
    """A byte-level BPE of ``vocab`` tokens (EOS included, id 0) on ``texts``: any text encodes, nothing is unknown."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode(tok, texts: list[str]):
    """One long stream of ids: each text followed by EOS."""
    import torch

    eos = tok.token_to_id(EOS)
    ids = []
    for enc in tok.encode_batch(texts):
        ids += enc.ids + [eos]
    return torch.tensor(ids, dtype=torch.long)


def init(model) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights, the residual projections scaled by 1/√(2L) (norms keep their ones).

    torch's defaults (N(0, 1) embeddings, tied to the output) start at a loss of ~180 nats instead of ln V."""
    import torch

    resid = 0.02 / math.sqrt(2 * model.config.num_layers)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, 0.0, resid if name.endswith(("attn.o.weight", "ffn.down.weight")) else 0.02)


def token_losses(model, x, y):
    """Loss in nats of each next token: (B, T) for ids ``x`` and targets ``y`` of (B, T)."""
    import torch.nn.functional as F

    logits = model.logits(model(x))  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), reduction="none").view(y.shape)


def loss_of(model, x, y):
    import torch.nn.functional as F

    logits = model.logits(model(x))  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def windows(stream, context: int, stride: int | None = None):
    """(x, y) of (n, context): the stream cut into windows from its start, one every ``stride`` tokens (default:
    ``context``, whole windows that do not overlap), y one token ahead."""
    stride = stride or context
    if stride == context:
        n = (len(stream) - 1) // context
        return stream[: n * context].view(n, context), stream[1: n * context + 1].view(n, context)
    n = (len(stream) - 1 - context) // stride + 1  # windows whose every target exists
    return stream.unfold(0, context, stride)[:n], stream[1:].unfold(0, context, stride)[:n]


def losses_by_position(model, stream, context: int, batch: int = 16, stride: int | None = None):
    """Mean loss (nats) at each position of a window, (context,) float64, over the held-out stream's windows
    (``stride``: one window every so many tokens; with stride < context every token is scored at context /
    stride positions, so the positions' means compare the same tokens with more or less context before them)."""
    import torch

    xs, ys = windows(stream, context, stride)
    total = torch.zeros(context, dtype=torch.float64)
    with torch.no_grad():
        for i in range(0, len(xs), batch):
            total += token_losses(model, xs[i:i + batch], ys[i:i + batch]).double().sum(0)
    return total / len(xs)


def unigram_nats(train, held, vocab: int) -> float:
    """Loss (nats per token) of the unigram model of the training stream (add-one) on the held-out stream."""
    import torch

    counts = torch.bincount(train, minlength=vocab).double() + 1
    logp = (counts / counts.sum()).log()
    return float(-logp[held].mean())


def lr_at(step: int, steps: int, lr: float) -> float:
    """Linear warmup over the first 5 % of ``steps``, then a cosine from ``lr`` down to lr/10 at the last step."""
    warm = max(1, steps // 20)
    if step < warm:
        return lr * (step + 1) / warm
    scale = 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))
    return lr * (0.1 + 0.9 * scale)


def repeated(window, gen, spans: int = 1, shortest: int = 16, longest: int = 256):
    """``window`` with ``spans`` stretches of it written again further on: each a span of ``shortest``–``longest``
    tokens copied over a later place at any distance the window allows (all drawn from ``gen``). Source code repeats
    itself this way (a name, a call, a line pasted again) but rarely enough that a small model learns to read
    only its last few hundred tokens; a window with a certain repeat rewards looking back to any distance."""
    import torch

    n, out = len(window), window.clone()
    for _ in range(spans):
        span = int(torch.randint(shortest, longest + 1, (1,), generator=gen))
        src = int(torch.randint(0, n - 2 * span, (1,), generator=gen))
        dst = int(torch.randint(src + span, n - span + 1, (1,), generator=gen))
        out[dst:dst + span] = out[src:src + span].clone()
    return out


def planted(window, gen, vocab: int, kind: str = "pairs", spans: int = 1):
    """(``window`` with stretches of random token ids written into it, ``scored`` (len - 1,) bool: the targets
    the loss counts). No text predicts a random id, so only a model that reads back can lower the loss on a
    stretch's second copy: the signal that forms an induction head, which text alone (even with
    :func:`repeated`) did not give this small model in its budget. The first copy's targets are not scored
    (nothing can predict them; scoring them only teaches the model to hedge).

    ``kind="periodic"``: one stretch of 4-32 random ids, written again and again from a random start in the
    window's first quarter to its end (short windows: many scored copies, the curriculum's first phase).
    ``kind="pairs"``: ``spans`` stretches of 8-64 random ids, each written twice, the second copy at any
    distance the window allows (long windows: reading back to any distance; a later stretch may overwrite an
    earlier one). Ids are drawn from 1 to ``vocab`` - 1 (0 is EOS)."""
    import torch

    n, out = len(window), window.clone()
    scored = torch.ones(n - 1, dtype=torch.bool)  # target j is out[j + 1]
    if kind == "periodic":
        period = int(torch.randint(4, 33, (1,), generator=gen))
        start = int(torch.randint(1, max(2, n // 4), (1,), generator=gen))
        copies = (n - start) // period
        out[start:start + copies * period] = torch.randint(1, vocab, (period,), generator=gen).repeat(copies)
        scored[start - 1:start + period - 1] = False
        return out, scored
    if kind != "pairs":
        raise ValueError(f"kind must be 'pairs' or 'periodic', got {kind!r}")
    for _ in range(spans):
        length = int(torch.randint(8, 65, (1,), generator=gen))
        src = int(torch.randint(1, n - 2 * length, (1,), generator=gen))
        dst = int(torch.randint(src + length, n - length + 1, (1,), generator=gen))
        out[src:src + length] = out[dst:dst + length] = torch.randint(1, vocab, (length,), generator=gen)
        scored[src - 1:src + length - 1] = False
    return out, scored


def fit(model, stream, *, steps: int, batch: int, context: int, lr: float, seed: int, log=print,
        until: int | None = None, minutes: float | None = None, every: int = 100, checkpoint=None,
        checkpoint_s: float | None = None, repeat: float = 0.0, spans: int = 1, plant: float = 0.0,
        plant_kind: str = "pairs") -> dict:
    """AdamW on windows of ``context`` tokens drawn at random (one seeded generator) from ``stream``, the
    learning rate scheduled to ``steps``; a share ``repeat`` of the windows carries ``spans`` stretches twice
    (:func:`repeated`), and a share ``plant`` carries random stretches of ``plant_kind`` (:func:`planted`, ``spans``
    of them for pairs), whose first copies the loss leaves out. It stops after ``until`` steps (default ``steps``) or when
    ``minutes`` of wall time have passed, whichever is first; ``checkpoint(step)`` runs every
    ``checkpoint_s`` seconds. Returns what ran: {"steps": done, "seconds": wall time}."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    start = last_save = time.perf_counter()
    done = 0
    for step in range(steps if until is None else min(until, steps)):
        if minutes is not None and time.perf_counter() - start > 60 * minutes:
            log(f"stopping at step {step}: the budget of {minutes} minutes is spent")
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr)
        at = torch.randint(0, len(stream) - context - 1, (batch,), generator=gen)  # (batch,)
        seqs = [stream[i:i + context + 1] for i in at.tolist()]  # (context + 1,) each: inputs and targets
        if repeat > 0:
            draws = torch.rand(batch, generator=gen).tolist()
            seqs = [repeated(s, gen, spans) if u < repeat else s for s, u in zip(seqs, draws)]
        scored = [None] * batch
        if plant > 0:
            draws = torch.rand(batch, generator=gen).tolist()
            vocab = model.config.vocab_size
            for i, u in enumerate(draws):
                if u < plant:
                    seqs[i], scored[i] = planted(seqs[i], gen, vocab, plant_kind, spans)
        x, y = torch.stack([s[:-1] for s in seqs]), torch.stack([s[1:] for s in seqs])  # (batch, context)
        if plant > 0:
            keep = torch.stack([torch.ones(context, dtype=torch.bool) if m is None else m for m in scored])
            loss = token_losses(model, x, y)[keep].mean()
        else:
            loss = loss_of(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        if step % every == 0 or done == steps:
            log(f"step {step:5d}  loss {loss.item():.3f}  {time.perf_counter() - start:6.0f} s")
        if checkpoint is not None and checkpoint_s is not None and time.perf_counter() - last_save > checkpoint_s:
            model.eval()
            checkpoint(done)
            model.train()
            last_save = time.perf_counter()
    return {"steps": done, "seconds": round(time.perf_counter() - start, 1)}


def hf_state(model) -> dict:
    """The model's tensors under transformers' Llama names (the inverse of attnlab.transformer.weights' map), float16."""
    from attnlab.transformer.weights import LAYOUT

    layer_prefix, layer_names, top_names = LAYOUT["llama"]
    state = model.state_dict()
    out = {}
    for ours, theirs in top_names:
        out[f"model.{theirs}.weight"] = state[f"{ours}.weight"]
    for i in range(model.config.num_layers):
        for ours, theirs in layer_names:
            out[f"model.{layer_prefix.format(i=i)}{theirs}.weight"] = state[f"blocks.{i}.{ours}.weight"]
    return {k: v.detach().half().contiguous() for k, v in out.items()}


def hf_config(c) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": c.vocab_size,
        "hidden_size": c.d_model, "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "intermediate_size": c.d_ff,
        "max_position_embeddings": c.max_positions, "rope_theta": c.rope_theta, "rms_norm_eps": c.norm_eps,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True,
        # stored in float16 (half the file), computed in float32: transformers loads a model in the dtype
        # its config names, and a float16 forward on the CPU is slow and far from attnlab's
        "bos_token_id": None, "eos_token_id": 0, "pad_token_id": None, "torch_dtype": "float32",
    }


def save(model, tok, report: dict, out: Path) -> None:
    """The folder both loaders read: config.json, model.safetensors, the tokenizer's two files, training.json."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config(model.config), indent=2) + "\n")
    save_file(hf_state(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "bos_token": None, "unk_token": None,
        "model_max_length": model.config.max_positions, "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
