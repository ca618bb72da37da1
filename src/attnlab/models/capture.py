"""Capturing every head's post-softmax weights for sentences or sentence pairs.

Sentences are tokenized one by one (so single sentences and pairs may be mixed), grouped into
batches of similar length to waste little on padding, run through the model with attnlab's
capturing attention (:mod:`attnlab.models.capture_attention`), and cut back to their own length:
a map never contains a padding position, and padding never changes a map (the mask function
registered with the attention function sees to that).

Word boundaries come from the fast tokenizer's ``word_ids()`` and ``sequence_ids()``, so WordPiece
(``##``), byte-level BPE (``Ġ``) and SentencePiece (``▁``) all give whole words; a word's text is
the span of the original sentence its pieces cover.
"""

from __future__ import annotations

import logging
import os
import unicodedata
from typing import Any, Callable, Iterator

import numpy as np

from attnlab.models.loading import LoadedModel, load_model
from attnlab.models.maps import AttentionMaps, Sentence

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 16
Progress = Callable[[int, int], None]  # (sentences done, total)


def is_punctuation(text: str) -> bool:
    """True for a non-empty word made only of punctuation characters (Unicode category P*)."""
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def check_sentences(sentences: Any) -> list[Sentence]:
    """A list of non-empty sentences or (A, B) pairs, or a ValueError/TypeError that says what is wrong."""
    if isinstance(sentences, (str, tuple)):
        sentences = [sentences]
    try:
        items = list(sentences)
    except TypeError:
        raise TypeError(f"sentences must be a list of str or (str, str) pairs, got {type(sentences).__name__}") from None
    if not items:
        raise ValueError("sentences is empty; give at least one sentence")
    out: list[Sentence] = []
    for i, s in enumerate(items):
        parts = (s,) if isinstance(s, str) else tuple(s) if isinstance(s, (tuple, list)) else None
        if parts is None or len(parts) not in (1, 2) or not all(isinstance(p, str) for p in parts):
            raise TypeError(f"sentences[{i}] must be a str or a (str, str) pair, got {s!r}")
        for p in parts:
            if not p.strip():
                raise ValueError(f"sentences[{i}] is empty; every sentence needs at least one word")
        out.append(parts[0] if len(parts) == 1 else (parts[0], parts[1]))
    return out


def _words(enc: Any, texts: tuple[str, ...]) -> tuple[list[int], list[str], list[str]]:
    """Group one sentence's tokens into words: (word_of per token, word texts, word kinds).

    ``enc`` is the tokenizer's output for the sentence (a fast ``BatchEncoding`` with offsets).
    """
    toks, offsets = enc.tokens(), enc["offset_mapping"]
    word_of: list[int] = []
    spans: list[list[int]] = []  # per word: [segment, start, end] or [-1, token index, 0] for a special token
    index: dict[tuple[int, int], int] = {}
    for t, (wid, sid) in enumerate(zip(enc.word_ids(), enc.sequence_ids())):
        start, end = offsets[t]
        if wid is None or sid is None:
            spans.append([-1, t, 0])
            word_of.append(len(spans) - 1)
            continue
        key = (sid, wid)
        if key not in index:
            index[key] = len(spans)
            spans.append([sid, start, end])
        w = index[key]
        spans[w][1], spans[w][2] = min(spans[w][1], start), max(spans[w][2], end)
        word_of.append(w)
    words, kinds = [], []
    for w, (sid, start, end) in enumerate(spans):
        if sid < 0:
            words.append(toks[start])
            kinds.append("cls" if start == 0 else "sep")
            continue
        text = texts[sid][start:end].strip() or toks[word_of.index(w)]
        words.append(text)
        kinds.append("punct" if is_punctuation(text) else "word")
    return word_of, words, kinds


def _encode(lm: LoadedModel, sentence: Sentence, limit: int, i: int) -> Any:
    texts = (sentence,) if isinstance(sentence, str) else sentence
    enc = lm.tokenizer(*texts, add_special_tokens=True, return_offsets_mapping=True)
    n = len(enc["input_ids"])
    if n > limit:
        raise ValueError(f"sentences[{i}] has {n} tokens; model {lm.model_id!r} takes at most {limit}")
    return enc


def iter_capture(
    sentences: Any,
    model: str | os.PathLike | LoadedModel | None = None,
    revision: str | None = None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Progress | None = None,
) -> Iterator[tuple[list[int], AttentionMaps]]:
    """Capture batch by batch: yields (indices into ``sentences``, their maps), for corpora too big
    to hold every map at once. Batches group sentences of similar length, so indices are not in order."""
    import torch

    items = check_sentences(sentences)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    lm = model if isinstance(model, LoadedModel) else load_model(model, revision)
    limit = min(lm.tokenizer.model_max_length, lm.config.get("max_position_embeddings") or 10**9)
    encs = [_encode(lm, s, limit, i) for i, s in enumerate(items)]
    order = sorted(range(len(items)), key=lambda i: len(encs[i]["input_ids"]))
    pad = lm.tokenizer.pad_token_id
    done = 0
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        lengths = [len(encs[i]["input_ids"]) for i in idx]
        t = max(lengths)
        ids = torch.full((len(idx), t), pad, dtype=torch.long)  # (B, T), right-padded
        mask = torch.zeros((len(idx), t), dtype=torch.long)  # (B, T), 1 = real token
        types = torch.zeros((len(idx), t), dtype=torch.long)
        for r, i in enumerate(idx):
            n = lengths[r]
            ids[r, :n] = torch.tensor(encs[i]["input_ids"])
            mask[r, :n] = 1
            if "token_type_ids" in encs[i]:
                types[r, :n] = torch.tensor(encs[i]["token_type_ids"])
        inputs = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in encs[idx[0]]:
            inputs["token_type_ids"] = types
        with torch.inference_mode():
            out = lm.model(**inputs, output_attentions=True)
        if not out.attentions or len(out.attentions) != lm.num_layers:
            raise RuntimeError(
                f"model {lm.model_id!r} returned {len(out.attentions or ())} attention maps for "
                f"{lm.num_layers} layers; is it a BERT-, RoBERTa- or GPT-2-style model?"
            )
        stacked = torch.stack(out.attentions, dim=1).float().numpy()  # (B, L, H, T, T)
        tokens, weights, word_of, words, kinds = [], [], [], [], []
        for r, i in enumerate(idx):
            n = lengths[r]
            texts = (items[i],) if isinstance(items[i], str) else items[i]
            wo, ws, ks = _words(encs[i], texts)
            tokens.append(encs[i].tokens())
            weights.append(np.ascontiguousarray(stacked[r, :, :, :n, :n]))  # drop padded rows and columns
            word_of.append(wo)
            words.append(ws)
            kinds.append(ks)
        done += len(idx)
        if progress is not None:
            progress(done, len(items))
        yield idx, AttentionMaps(
            sentences=[items[i] for i in idx], tokens=tokens, weights=weights, word_of=word_of, words=words,
            kinds=kinds, model_id=lm.model_id, revision=lm.revision, num_layers=lm.num_layers,
            num_heads=lm.num_heads, config=lm.config,
        )


def capture(
    sentences: Any,
    model: str | os.PathLike | LoadedModel | None = None,
    revision: str | None = None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Progress | None = None,
) -> AttentionMaps:
    """Every layer's and head's post-softmax weights for each sentence or (A, B) pair.

    ``model``: None (the bundled all-MiniLM-L6-v2), a model folder, or a hub id with ``revision``.
    Returns :class:`AttentionMaps` in the order given; ``weights[i]`` is float32 [L, H, T, T].
    """
    items = check_sentences(sentences)
    slots: list[Any] = [None] * len(items)
    meta = None
    for idx, part in iter_capture(items, model, revision, batch_size=batch_size, progress=progress):
        meta = part
        for r, i in enumerate(idx):
            slots[i] = (part.tokens[r], part.weights[r], part.word_of[r], part.words[r], part.kinds[r])
    tokens, weights, word_of, words, kinds = (list(x) for x in zip(*slots))
    return AttentionMaps(
        sentences=items, tokens=tokens, weights=weights, word_of=word_of, words=words, kinds=kinds,
        model_id=meta.model_id, revision=meta.revision, num_layers=meta.num_layers, num_heads=meta.num_heads,
        config=meta.config,
    )
