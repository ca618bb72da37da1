"""The induction probe: a seeded random token sequence repeated once (Olsson et al. 2022; as in
TransformerLens and ARENA). An induction head at position i of the second copy attends to the
token that followed the same token in the first copy: position i − n + 1 for a sequence of n
tokens. Its score is the mean weight on that position over the second copy and the batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

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

    def heads(self, threshold: float = INDUCTION_PROBE_THRESHOLD) -> list[tuple[int, int]]:
        """Heads (layer0, head0) scoring at least ``threshold``, best first."""
        found = [(int(l), int(h)) for l, h in zip(*np.nonzero(self.scores >= threshold))]
        return sorted(found, key=lambda lh: -self.scores[lh])

    def to_dict(self) -> dict:
        """JSON-ready; layers and heads 1-based."""
        return {
            "model_id": self.model_id, "revision": self.revision, "length": self.length, "batch": self.batch,
            "seed": self.seed, "prefix": self.prefix, "threshold": INDUCTION_PROBE_THRESHOLD,
            "induction_heads": [{"layer": l + 1, "head": h + 1, "score": round(float(self.scores[l, h]), 6)}
                                for l, h in self.heads()],
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
    limit = lm.config.get("max_position_embeddings") or 10**9
    if 2 * length + (prefix is not None) > limit:
        raise ValueError(f"length={length} makes {2 * length + 1} tokens; {lm.model_id!r} takes at most {limit}")
    ids = repeated_tokens(len(tok), set(tok.all_special_ids), length, batch, seed, prefix)
    w = capture_ids(ids, lm)  # (B, L, H, T, T)
    start = ids.shape[1] - length  # first position of the second copy
    rows = np.arange(start, ids.shape[1])
    cols = rows - length + 1
    scores = w[:, :, :, rows, cols].mean(axis=(0, -1))  # (L, H)
    return InductionScores(scores=scores.astype(np.float64), length=length, batch=batch, seed=seed,
                           prefix=None if prefix is None else tok.convert_ids_to_tokens(prefix),
                           model_id=lm.model_id, revision=lm.revision)
