"""Capturing every head's post-softmax weights for sentences, sentence pairs or (source, target) pairs.

Sentences are tokenized one by one (so single sentences and pairs may be mixed), grouped into
batches of similar length to waste little on padding, run through the model with attnlab's
capturing attention (:mod:`attnlab.hf.capture_attention`), and cut back to their own length:
a map never contains a padding position, and padding never changes a map (the mask function
registered with the attention function sees to that).

Encoders (BERT, RoBERTa) and decoders (GPT-2, Llama, Qwen2, Mistral, Gemma-2) give one map per
layer. An encoder–decoder (T5, BART) takes (source, target) pairs and gives three records:
``self_attention`` (the encoder's, over the source), ``decoder`` (the decoder's causal
self-attention over its input: the start token, then the target) and ``cross`` (decoder → encoder,
[L_dec, H, T_target, T_source]).

A model with learned sinks (gpt-oss: one logit per head in the softmax, with no value) gives rows that
add up to less than 1; its record keeps each row's sink share, ``sink_share[i]`` [L, H, T], the rest
(:mod:`attnlab.hf.capture_attention`). A model without sinks has ``sink_share`` None.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Callable, Iterator

import numpy as np

from attnlab.hf.encoding import Encoded, check_sentences, decoder_input, encode
from attnlab.hf.loading import LoadedModel, load_model
from attnlab.maps.long import MAX_MAP_BYTES, check_full
from attnlab.maps.records import Attention, LayerFacts, Tokens
from attnlab.maps.tokens import AttentionMaps, gather

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 16
Progress = Callable[[int, int], None]  # (sentences done, total)


def _pad(seqs: list[list[int]], pad: int) -> tuple[Any, Any]:
    """Right-padded (B, T) ids and the (B, T) mask of real tokens (1 = real)."""
    import torch

    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), t), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s)
        mask[r, : len(s)] = 1
    return ids, mask


def _stack(per_layer: Any, r: int, tq: int, tk: int) -> np.ndarray:
    """Layer tensors (B, H, Tq', Tk') → sentence r's [L, H, tq, tk], padding cut, float32 NumPy."""
    import torch

    return np.ascontiguousarray(torch.stack([a[r, :, :tq, :tk] for a in per_layer]).float().numpy())


def _facts(calls: list[dict]) -> tuple[LayerFacts, ...]:
    """What reproduces the weights from queries and keys: per layer scale, softcap, causal, window, sinks."""
    return tuple(LayerFacts(scale=c["scale"], softcap=c["softcap"], causal=c["causal"], window=c["window"],
                            sink_logits=c["sinks"]) for c in calls)


def _biases(calls: list[dict], tq: list[int], tk: list[int]) -> list[np.ndarray] | None:
    """Each sentence's position bias [L, H, tq, tk] (zeros for a layer that adds none), or None where
    no layer adds a bias that is not zero (BART; T5's cross-attention, which adds zeros)."""
    import torch

    if not any(c["bias"] is not None and bool((c["bias"] != 0).any()) for c in calls):
        return None
    per_layer = [  # (B, H, Tq', Tk') each
        (c["bias"] if c["bias"] is not None else torch.zeros(1, *c["query"].shape[1:3], c["key"].shape[2]))
        .expand(len(tq), -1, -1, -1) for c in calls
    ]
    return [_stack(per_layer, r, tq[r], tk[r]) for r in range(len(tq))]


def _shares(shares: list, r: int, tq: int) -> np.ndarray:
    """Layer sink shares (B, H, Tq') → sentence r's [L, H, tq], padding cut, float32 NumPy."""
    import torch

    return np.ascontiguousarray(torch.stack([s[r, :, :tq] for s in shares]).float().numpy())


def _record(per_layer: Any, query_side: Tokens, key_side: Tokens, calls: list[dict] | None,
            shares: list | None = None) -> Attention:
    """One attention's record from the model's per-layer weights (B, H, Tq', Tk') and, with
    ``capture(qk=True)``, its recorded calls: queries [L, H, tq, D], keys [L, H, tk, D], bias, facts;
    ``shares``: per layer the rows' sink shares (B, H, Tq') of a model with learned sinks."""
    tq, tk = query_side.lengths(), key_side.lengths()
    rows = range(len(tq))
    weights = [_stack(per_layer, r, tq[r], tk[r]) for r in rows]
    sink_share = None if shares is None else [_shares(shares, r, tq[r]) for r in rows]
    queries = keys = bias = facts = None
    if calls is not None:
        queries = [_stack([c["query"] for c in calls], r, tq[r], None) for r in rows]
        keys = [_stack([c["key"] for c in calls], r, tk[r], None) for r in rows]
        bias, facts = _biases(calls, tq, tk), _facts(calls)
    return Attention(weights=weights, query_side=query_side, key_side=key_side, num_layers=len(per_layer),
                     num_heads=weights[0].shape[1], queries=queries, keys=keys, position_bias=bias, layers=facts,
                     sink_share=sink_share)


def _split_calls(calls: list[dict], enc_layers: int, dec_layers: int, model_id: str) -> tuple[list, list, list]:
    """One forward's recorded attention calls → (the encoder's or the model's own, the decoder's
    self-attention, the cross-attention): an encoder–decoder's decoder layers call self-attention
    (causal) then cross-attention, in order."""
    dec, cross = calls[enc_layers::2], calls[enc_layers + 1::2]
    if (len(calls) != enc_layers + 2 * dec_layers or not all(c["causal"] for c in dec)
            or any(c["causal"] for c in cross)):
        want = (f"{enc_layers} + 2 × {dec_layers}: the encoder's layers, then per decoder layer a causal "
                f"self-attention and a cross-attention") if dec_layers else f"{enc_layers}, one per layer"
        raise RuntimeError(f"model {model_id!r} made {len(calls)} attention calls in one forward; capture(qk=True) "
                           f"reads {want}")
    return calls[:enc_layers], dec, cross


def _own_shares(shares: list, lm: LoadedModel, seq2seq: bool) -> list | None:
    """The rows' sink shares (B, H, Tq) of each layer of a model with learned sinks (gpt-oss: every layer
    has them), or None for a model without."""
    found = sum(s is not None for s in shares)
    if not found:
        return None
    if seq2seq or found != len(shares) or len(shares) != lm.num_layers:
        raise RuntimeError(f"model {lm.model_id!r} made {len(shares)} attention calls in one forward, {found} with "
                           f"learned sinks; capture reads learned sinks on every layer of a decoder-only model "
                           f"({lm.num_layers} layers)")
    return shares


def _encodings(lm: LoadedModel, items: list, seq2seq: bool) -> list[tuple[Encoded, Encoded | None]]:
    limit = lm.max_tokens
    out = []
    for i, s in enumerate(items):
        if not seq2seq:
            texts = (s,) if isinstance(s, str) else s
            out.append((encode(lm.tokenizer, texts, limit, f"sentences[{i}]", lm.model_id), None))
            continue
        if isinstance(s, str):
            raise ValueError(f"sentences[{i}] is one string, but {lm.model_id!r} is an encoder–decoder model: "
                             f"give (source, target) pairs")
        src = encode(lm.tokenizer, (s[0],), limit, f"sentences[{i}] (source)", lm.model_id)
        tgt = encode(lm.tokenizer, (s[1],), limit, f"sentences[{i}] (target)", lm.model_id, target=True)
        start = lm.config.get("decoder_start_token_id")
        start = lm.tokenizer.pad_token_id if start is None else start
        out.append((src, decoder_input(tgt, start, lm.tokenizer.convert_ids_to_tokens(start))))
    return out


def _check_memory(lm: LoadedModel, encs: list, order: list[int], batch_size: int, max_bytes: int | None) -> None:
    """Refuse, before the first forward, a batch whose T × T weights would pass ``max_bytes``
    (:func:`attnlab.maps.long.check_full`): the longest batch counts, its sequences padded to its longest."""
    if max_bytes is None:
        return
    last = order[(len(order) - 1) // batch_size * batch_size:]  # sorted by length: the longest batch is the last
    longest = max(len(e.ids) for i in last for e in encs[i] if e is not None)
    where = f"sentences[{last[-1]}]" if len(last) == 1 else f"a batch of {len(last)} sentences"
    check_full(f"capturing {where} ({longest} tokens, {lm.num_layers} layers × {lm.num_heads} heads)", lm.num_layers,
               lm.num_heads, longest, len(last) * (3 if lm.config.get("is_encoder_decoder") else 1), max_bytes,
               instead="take the long view (attnlab.capture_long, or `attnlab maps`, which takes it by itself above "
                       "1024 tokens), or pass max_bytes=None to hold them anyway")


def _tokens(encs: list[Encoded]) -> Tokens:
    return Tokens(tokens=[e.tokens for e in encs], word_of=[e.word_of for e in encs], words=[e.words for e in encs],
                  kinds=[e.kinds for e in encs])


def iter_capture(
    sentences: Any,
    model: str | os.PathLike | LoadedModel | None = None,
    revision: str | None = None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Progress | None = None,
    qk: bool = False,
    max_bytes: int | None = MAX_MAP_BYTES,
) -> Iterator[tuple[list[int], AttentionMaps]]:
    """Capture batch by batch: yields (indices into ``sentences``, their maps), for corpora too big
    to hold every map at once. Batches group sentences of similar length, so indices are not in order.
    ``max_bytes``: as :func:`capture`; every batch is checked before any runs."""
    import torch

    from attnlab.hf.capture_attention import recording, sink_shares

    items = check_sentences(sentences)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    lm = model if isinstance(model, LoadedModel) else load_model(model, revision)
    seq2seq = bool(lm.config.get("is_encoder_decoder"))
    encs = _encodings(lm, items, seq2seq)
    order = sorted(range(len(items)), key=lambda i: len(encs[i][0].ids))
    _check_memory(lm, encs, order, batch_size, max_bytes)
    pad = lm.tokenizer.pad_token_id
    done = 0
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        src = [encs[i][0] for i in idx]
        ids, mask = _pad([e.ids for e in src], pad)
        inputs = {"input_ids": ids, "attention_mask": mask}
        if src[0].type_ids is not None:
            inputs["token_type_ids"] = _pad([e.type_ids for e in src], 0)[0]
        if seq2seq:
            tgt = [encs[i][1] for i in idx]
            inputs["decoder_input_ids"], inputs["decoder_attention_mask"] = _pad([e.ids for e in tgt], pad)
        with torch.inference_mode(), (recording() if qk else contextlib.nullcontext()) as calls, sink_shares() as shares:
            out = lm.model(**inputs, output_attentions=True)
        enc_att = out.encoder_attentions if seq2seq else out.attentions
        if not enc_att or len(enc_att) != lm.num_layers:
            raise RuntimeError(
                f"model {lm.model_id!r} returned {len(enc_att or ())} attention maps for {lm.num_layers} layers; "
                f"is its attention one that transformers' attention interface serves?"
            )
        source = _tokens(src)
        own_calls = self_calls = cross_calls = None
        if qk:
            dec_layers = len(out.decoder_attentions) if seq2seq else 0
            own_calls, self_calls, cross_calls = _split_calls(calls, lm.num_layers, dec_layers, lm.model_id)
        decoder = cross = None
        if seq2seq:
            target = _tokens(tgt)
            decoder = _record(out.decoder_attentions, target, target, self_calls)
            cross = _record(out.cross_attentions, target, source, cross_calls)
        done += len(idx)
        if progress is not None:
            progress(done, len(items))
        own = _record(enc_att, source, source, own_calls, _own_shares(shares, lm, seq2seq))
        yield idx, AttentionMaps(sentences=[items[i] for i in idx], self_attention=own, decoder=decoder, cross=cross,
                                 model_id=lm.model_id, revision=lm.revision, config=lm.config)


def capture(
    sentences: Any,
    model: str | os.PathLike | LoadedModel | None = None,
    revision: str | None = None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Progress | None = None,
    qk: bool = False,
    max_bytes: int | None = MAX_MAP_BYTES,
) -> AttentionMaps:
    """Every layer's and head's post-softmax weights for each sentence, (A, B) pair, or (for an
    encoder–decoder) (source, target) pair. A string with one tab is a pair too ("A\tB" is
    ("A", "B")), as in the CLI and corpus files; the tuple is the clearer form.

    ``model``: None (the bundled all-MiniLM-L6-v2), a model folder, or a hub id with ``revision``.
    Returns :class:`AttentionMaps` in the order given, one record per attention of the model
    (:class:`~attnlab.maps.records.Attention`): ``self_attention`` (``maps.weights[i]`` is its float32
    [L, H, T, T]) and, for an encoder–decoder, ``decoder`` and ``cross`` ([L_dec, H, T_target, T_source]).
    ``qk=True`` also keeps each record's ``queries[i]`` and ``keys[i]``, [L, H, T, D_head] as the
    attention function received them (after RoPE, before scaling; grouped-query keys repeated per
    query head), ``layers`` (per layer :class:`~attnlab.maps.records.LayerFacts`: scale, softcap,
    causal, window) and ``position_bias[i]`` [L, H, Tq, Tk] (T5's relative position bias; None for
    models that add none), to recompute the weights from them: softmax(softcap(q·kᵀ·scale) + bias + mask).
    A model with learned sinks (gpt-oss) also gives ``self_attention.sink_share[i]`` [L, H, T]: each row's
    share of the sink, so that the row's weights add up to 1 minus it (None for a model without sinks).

    ``max_bytes``: before the model runs, the capture estimates what its T × T weights would hold at
    the peak (:func:`attnlab.maps.long.full_capture_bytes`) and refuses more than this with
    :class:`~attnlab.maps.long.MapTooLarge` (a ValueError naming the bytes); None holds any size.
    A long input's view without T × T is :func:`attnlab.hf.capture_long.capture_long`.
    """
    items = check_sentences(sentences)
    slots: list[Any] = [None] * len(items)
    parts = []
    for idx, part in iter_capture(items, model, revision, batch_size=batch_size, progress=progress, qk=qk,
                                  max_bytes=max_bytes):
        parts.append(part)
        for r, i in enumerate(idx):
            slots[i] = (len(parts) - 1, r)
    return gather(parts, slots)


def capture_ids(ids: Any, model: str | os.PathLike | LoadedModel | None = None, revision: str | None = None) -> np.ndarray:
    """Every layer's and head's weights for token ids given directly (no tokenizer, no padding):
    ids (B, T) ints → float32 [B, L, H, T, T]. For probes built from tokens, such as a repeated
    random sequence (:mod:`attnlab.interventions.induction`)."""
    import torch

    lm = model if isinstance(model, LoadedModel) else load_model(model, revision)
    if lm.config.get("is_encoder_decoder"):
        raise ValueError(f"capture_ids runs encoders and decoders; {lm.model_id!r} is an encoder–decoder")
    ids = torch.as_tensor(np.asarray(ids), dtype=torch.long)
    if ids.ndim != 2 or ids.shape[1] < 1:
        raise ValueError(f"ids must be (B, T) token ids, got shape {tuple(ids.shape)}")
    check_full(f"capture_ids of {ids.shape[0]} × {ids.shape[1]} ids", lm.num_layers, lm.num_heads, ids.shape[1],
               ids.shape[0])
    with torch.inference_mode():
        out = lm.model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True)
    return torch.stack(out.attentions, dim=1).float().numpy()  # (B, L, H, T, T)
