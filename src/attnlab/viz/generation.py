"""What a generation shows: the Generation view's steps, and the maps file of the generated sequence.

:meth:`attnlab.transformer.Transformer.generate` with ``maps=True`` keeps, per step t, one attention
row per layer and head, ``[L, H, P + t]``: the query at position P − 1 + t (the token fed at step t,
whose output chose new token t) over every position before it. :func:`steps_payload` hands those
rows to the viewer as they are (rounded for JSON); :func:`generation_maps` makes them the rows
P − 1 … P + N − 2 of an ordinary :class:`~attnlab.maps.records.AttentionMaps` of the N + P − 1
tokens the model read, the prompt's own rows taken from one pass over the prompt
(``hook_pattern`` of ``Transformer.run_with_cache``), so that the file loads and reads like any other maps.
A model with learned sinks (gpt-oss) gives rows that add up to less than 1: the maps keep each row's sink
share, the rest of its 1 (``sink_share``; docs/design.md, "Maps").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.hf.encoding import is_punctuation
from attnlab.maps.records import Attention, Tokens
from attnlab.maps.tokens import AttentionMaps

DIGITS = 5  # decimals of a weight in the JSON (1e-5: far below a pixel of the view)
SHOWN = {"\n": "↵", "\t": "⇥"}


def token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """What each token reads as: its own text (a byte-level piece alone decodes to itself, a split
    character to U+FFFD), newlines and tabs as visible signs, a token of spaces alone as ␣."""
    out = []
    for i in ids:
        text = tokenizer.decode([i]) if tokenizer is not None else str(i)
        for raw, sign in SHOWN.items():
            text = text.replace(raw, sign)
        out.append(text.replace(" ", "␣") if text and not text.strip() else text or "∅")
    return out


def _rows(gen: Any, b: int) -> list[np.ndarray]:
    if gen.attention is None:
        raise ValueError("the generation holds no attention rows; generate with maps=True")
    if not 0 <= b < len(gen.attention):
        raise ValueError(f"sequence must be in 0..{len(gen.attention) - 1}, got {b}")
    return gen.attention[b]


def steps_payload(model: Any, gen: Any, model_id: str, b: int = 0) -> dict:
    """The Generation view's data for sequence ``b``: the tokens (prompt, then the new ones), and per
    step the position of its query, the token it chose and its rows ``[L][H][P + t]`` (0-based layers
    and heads in the arrays; the page labels them from 1)."""
    rows, c = _rows(gen, b), model.config
    seq, prompt_len = gen.sequences[b], gen.prompt_lengths[b]
    steps = [{"step": t, "position": int(gen.positions[b][t]), "token": int(seq[prompt_len + t]),
              "rows": np.round(r.astype(np.float64), DIGITS).tolist()} for t, r in enumerate(rows)]
    return {
        "model": {"id": model_id, "num_layers": c.num_layers, "num_heads": c.num_heads},
        "labels": token_texts(model.tokenizer, seq), "prompt_length": prompt_len,
        "prompt": model.tokenizer.decode(seq[:prompt_len]) if model.tokenizer is not None else None,
        "text": gen.text[b] if gen.text is not None else None, "steps": steps,
    }


def _words(texts: list[str]) -> tuple[list[int], list[str], list[str]]:
    """Tokens → words as attnlab's word rule has it: a word starts at white space and where a run of
    punctuation begins or ends (byte-level BPE carries the space on the token that follows it)."""
    word_of, words, kinds, prev = [], [], [], None
    for text in texts:
        punct = is_punctuation(text.strip())
        if prev is None or text[:1].isspace() or punct != prev or not text.strip(" ␣"):
            words.append("")
            kinds.append("punct" if punct else "word")
        words[-1] += text
        word_of.append(len(words) - 1)
        prev = punct
    return word_of, [w.strip() or w for w in words], kinds


def generation_maps(model: Any, gen: Any, model_id: str, revision: str | None = None, b: int = 0) -> AttentionMaps:
    """The maps [L, H, T, T] of the T = P + N − 1 tokens the model read for sequence ``b`` (the prompt
    and every new token but the last, which no step fed back): rows 0 … P − 2 from a pass over the
    prompt, rows P − 1 … T − 1 the generation's own rows."""
    import torch

    rows, c = _rows(gen, b), model.config
    seq, P = gen.sequences[b], gen.prompt_lengths[b]
    T = P + len(rows) - 1
    weights = np.zeros((c.num_layers, c.num_heads, T, T), dtype=np.float32)
    if P > 1:
        names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(c.num_layers)]
        with torch.no_grad():
            _, cache = model.run_with_cache(torch.tensor([seq[:P]]), names=names, backend="torch")
        prompt = np.stack([cache[n][0].float().cpu().numpy() for n in names])  # (L, H, P, P)
        weights[:, :, : P - 1, :P] = prompt[:, :, : P - 1]
    for t, r in enumerate(rows):  # (L, H, P + t)
        weights[:, :, P - 1 + t, : P + t] = r
    tokens = (model.tokenizer.convert_ids_to_tokens(seq[:T]) if model.tokenizer is not None
              else [str(i) for i in seq[:T]])
    word_of, words, kinds = _words(token_texts(model.tokenizer, seq[:T]))
    text = model.tokenizer.decode(seq[:T]) if model.tokenizer is not None else " ".join(map(str, seq[:T]))
    config = {"family": c.family, "num_layers": c.num_layers, "num_heads": c.num_heads,
              "generated": {"prompt_length": P, "new_tokens": len(rows), "positions": gen.positions[b]}}
    side = Tokens(tokens=[tokens], word_of=[word_of], words=[words], kinds=[kinds])
    share = None
    if c.attn_sinks:  # learned sinks: each row's share of the sink is what its weights leave of 1
        share = [(1.0 - weights.sum(axis=-1, dtype=np.float64)).astype(np.float32)]  # (L, H, T)
    own = Attention(weights=[weights], query_side=side, key_side=side, num_layers=c.num_layers, num_heads=c.num_heads,
                    sink_share=share)
    return AttentionMaps(sentences=[text], self_attention=own, model_id=model_id, revision=revision, config=config)
