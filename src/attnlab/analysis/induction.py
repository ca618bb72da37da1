"""The induction score, one definition for every place that measures it (Olsson et al. 2022).

An induction head at a token that occurred before attends to the token that *followed* the earlier
occurrence. Given a head's weights and an *induction pattern* (1 on the key(s) each query row would
attend to as an induction head), a row's induction weight is the weight it puts on the pattern, and
a head's induction score is the mean of that weight over the rows that count:

- the ``induction`` role (:mod:`attnlab.analysis.roles`) counts every row of a sentence's word maps,
  as TransformerLens's ``detect_head`` ("mul" measure) does, with :func:`induction_pattern` of its words;
- the induction probe (:mod:`attnlab.interventions.induction`) counts the rows of the repeated copy
  of a random sequence, whose pattern is one key each (:func:`source_pattern`);
- the lesson's trained model (:mod:`attnlab.lesson.transformer`) counts the rows on a repeated
  segment, likewise one key each.
"""

from __future__ import annotations

import numpy as np


def duplicate_pattern(texts: list[str]) -> np.ndarray:
    """[W, W] 1 where word j < i is the same word as i (case-insensitive): TransformerLens's duplicate pattern."""
    folded = np.array([t.casefold() for t in texts], dtype=object)
    same = folded[:, None] == folded[None, :]
    return np.tril(same, k=-1).astype(np.float64)


def induction_pattern(texts: list[str]) -> np.ndarray:
    """[W, W] 1 where word j − 1 is an earlier copy of word i (j < i): the duplicate pattern shifted one right."""
    shifted = np.zeros((len(texts), len(texts)))
    shifted[:, 1:] = duplicate_pattern(texts)[:, :-1]
    return np.tril(shifted, k=-1)


def source_pattern(source: np.ndarray, num_keys: int) -> np.ndarray:
    """[..., T, num_keys] 1 at key ``source[..., t]`` of each row t, none where ``source`` is −1:
    the pattern of a sequence whose rows each have at most one induction target."""
    source = np.asarray(source)
    keys = np.arange(num_keys)
    return (source[..., None] == keys).astype(np.float64)  # −1 matches no key


def induction_weight(weights: np.ndarray, pattern: np.ndarray, rows: np.ndarray | None = None,
                     axis: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """The total induction weight and the number of rows it is over, so that totals add up over
    batches: (Σ over counted rows of the weight on ``pattern``, count).

    ``weights`` [..., Tq, Tk] (leading dims e.g. layer and head, or batch, layer and head);
    ``pattern`` broadcastable to it; ``rows`` boolean, broadcastable to [..., Tq], the rows that count
    (None: every row); ``axis``: leading axes pooled as well (e.g. the batch), as negative or
    non-negative indices of ``weights``.
    """
    on = (np.asarray(weights, dtype=np.float64) * pattern).sum(-1)  # [..., Tq]: each row's weight on its targets
    counted = np.ones(on.shape, dtype=bool) if rows is None else np.broadcast_to(rows, on.shape)
    pooled = tuple(axis) + (-1,)
    return np.where(counted, on, 0.0).sum(pooled), counted.sum(pooled)


def induction_score(weights: np.ndarray, pattern: np.ndarray, rows: np.ndarray | None = None,
                    axis: tuple[int, ...] = ()) -> np.ndarray:
    """Each head's induction score: :func:`induction_weight`'s total over its row count (0 where no
    row counts)."""
    total, count = induction_weight(weights, pattern, rows, axis)
    return total / np.maximum(count, 1)
