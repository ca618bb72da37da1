"""The induction probe: a seeded random token sequence repeated once (Olsson et al. 2022; as in
TransformerLens and ARENA). An induction head at position i of the second copy attends to the
token that followed the same token in the first copy: position i − n + 1 for a sequence of n
tokens. Its score is the mean weight on that position over the second copy and the batch
(:func:`attnlab.analysis.induction.induction_score`, the one definition)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.analysis.induction import induction_score, source_pattern
from attnlab.maps.heads import Head, ranked

DEFAULT_LENGTH = 50  # random tokens per copy
DEFAULT_BATCH = 4
INDUCTION_PROBE_THRESHOLD = 0.4  # a head scoring this or more counts as an induction head


@dataclass(frozen=True)
class InductionScores:
    """``scores`` [L, H]: mean weight of each head on the induction position over the repeated copy."""

    scores: np.ndarray
    length: int
    batch: int
    seed: int
    prefix: str | None  # the token that opens each sequence (BOS / [CLS]), if the model has one
    model_id: str
    revision: str | None

    def heads(self, threshold: float = INDUCTION_PROBE_THRESHOLD) -> list[Head]:
        """Heads scoring at least ``threshold``, best first."""
        return [found.head for found in ranked(self.scores, at_least=threshold)]

    def to_dict(self) -> dict:
        """JSON-ready; layers and heads 0-based."""
        return {
            "model_id": self.model_id, "revision": self.revision, "length": self.length, "batch": self.batch,
            "seed": self.seed, "prefix": self.prefix, "threshold": INDUCTION_PROBE_THRESHOLD,
            "induction_heads": [found.to_dict(digits=6) for found in ranked(self.scores, INDUCTION_PROBE_THRESHOLD)],
            "scores": np.round(self.scores, 6).tolist(),
        }


def repeated_tokens(vocab: int, special: set[int], length: int, batch: int, seed: int, prefix: int | None) -> np.ndarray:
    """(batch, [1 +] 2·length) ids: ``prefix``, then ``length`` random non-special tokens, twice."""
    if length < 2:
        raise ValueError(f"length must be at least 2 tokens, got {length}")
    pool = np.setdiff1d(np.arange(vocab), np.fromiter(special, dtype=np.int64, count=len(special)))
    if pool.size < 2:
        raise ValueError(f"the vocabulary has {pool.size} ordinary tokens; the probe needs at least 2")
    rand = np.random.default_rng(seed).choice(pool, size=(batch, length))
    head = np.full((batch, 1 if prefix is not None else 0), prefix if prefix is not None else 0, dtype=np.int64)
    return np.concatenate([head, rand, rand], axis=1)


def induction_scores(model: Any = None, revision: str | None = None, *, length: int = DEFAULT_LENGTH,
                     batch: int = DEFAULT_BATCH, seed: int = 0) -> InductionScores:
    """Each head's induction score on the standard probe (see the module docstring)."""
    from attnlab.hf.capture import capture_ids
    from attnlab.hf.loading import LoadedModel, load_model

    lm = model if isinstance(model, LoadedModel) else load_model(model, revision)
    tok = lm.tokenizer
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.cls_token_id
    limit = lm.max_tokens
    if (n := 2 * length + (prefix is not None)) > limit:
        raise ValueError(f"length={length} makes {n} tokens; {lm.model_id!r} takes at most {limit}")
    ids = repeated_tokens(len(tok), set(tok.all_special_ids), length, batch, seed, prefix)
    w = capture_ids(ids, lm)  # (B, L, H, T, T)
    t = ids.shape[1]
    source = np.arange(t) - length + 1  # row i of the second copy looks at i − n + 1, after its first copy
    source[: t - length] = -1  # the first copy (and the prefix) has no earlier copy to look after
    scores = induction_score(w, source_pattern(source, t), source >= 0, axis=(0,))  # (L, H): pooled over the batch
    return InductionScores(scores=scores.astype(np.float64), length=length, batch=batch, seed=seed,
                           prefix=None if prefix is None else tok.convert_ids_to_tokens(prefix),
                           model_id=lm.model_id, revision=lm.revision)
