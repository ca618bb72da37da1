"""Corpus statistics (Clark et al. 2019, §3): every role score per head, averaged over a text file.

Sentences are captured in batches and folded into running totals one batch at a time
(:class:`~attnlab.analysis.roles.RoleAccumulator`), so memory stays that of one batch however long
the corpus is. Under ``torchrun`` the sentences are shared out between the ranks (consecutive
runs, :func:`~attnlab.distributed.env.shard_items`), each rank folds its share, and the totals are
summed over the ranks with one all-reduce: every rank gets the result one process would (to the
rounding of float64 sums in another order).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from attnlab.analysis.roles import HeadRoles, RoleAccumulator, check_average


def read_text(path: str | os.PathLike, what: str = "text file") -> str:
    """The text of a UTF-8 file, or an error that names the path and says what was expected."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{what} {str(path)!r} is a folder; expected a UTF-8 text file")
    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = e.object[: e.start].count(b"\n") + 1
        raise ValueError(f"{what} {str(path)!r} is not UTF-8 text (byte 0x{e.object[e.start]:02x} on line {line}); "
                         f"expected a UTF-8 text file") from None


def read_corpus(path: str | os.PathLike) -> list[str | tuple[str, str]]:
    """One sentence per line, or a sentence pair separated by one tab; blank lines are skipped."""
    items: list[str | tuple[str, str]] = []
    for n, line in enumerate(read_text(path, "corpus file").split("\n"), 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) > 2 or not all(p.strip() for p in parts):
            raise ValueError(f"{path}:{n}: expected a sentence or two sentences separated by one tab, got {line!r}")
        items.append(parts[0] if len(parts) == 1 else (parts[0], parts[1]))
    if not items:
        raise ValueError(f"corpus file {str(path)!r} has no sentences")
    return items


def corpus_roles(
    sentences: Any,
    model: Any = None,
    revision: str | None = None,
    *,
    batch_size: int = 32,
    marks: Any = None,
    progress: Any = None,
    distributed: bool | str = "auto",
    group: Any = None,
    average: str = "row",
) -> HeadRoles:
    """Role scores per layer and head over many sentences (or pairs), captured batch by batch.

    ``progress(done, total)`` is called after each batch (of this rank's share). ``distributed``:
    True shares the sentences between the ranks of ``group`` (joining torchrun's job from its
    environment if no group exists yet); "auto" does so when there is a job of more than one
    process; False computes everything here. Every rank returns the same result. ``average``:
    ``"row"`` (every row of every sentence weighs the same, Clark et al.'s average) or
    ``"sentence"`` (every sentence weighs the same; see :mod:`attnlab.analysis.roles`).
    """
    from attnlab.distributed import env
    from attnlab.maps.words import to_words
    from attnlab.hf.capture import iter_capture
    from attnlab.hf.loading import LoadedModel, load_model

    check_average(average)
    rank, world = env.join(distributed, group)
    if world == 1:
        lm = model if isinstance(model, LoadedModel) else load_model(model, revision)
        acc = RoleAccumulator(lm.num_layers, lm.num_heads, average=average)
        for _, part in iter_capture(sentences, lm, batch_size=batch_size, progress=progress):
            acc.add(to_words(part, marks=marks))
        return acc.result(lm.model_id, lm.revision)
    def share() -> tuple[Any, RoleAccumulator]:
        lm = model if isinstance(model, LoadedModel) else load_model(model, revision)
        acc = RoleAccumulator(lm.num_layers, lm.num_heads, average=average)
        mine = env.shard_items(list(sentences), rank, world)
        if mine:  # more ranks than sentences: some have none
            for _, part in iter_capture(mine, lm, batch_size=batch_size, progress=progress):
                acc.add(to_words(part, marks=marks))
        _check_kinds(acc)
        return lm, acc

    lm, acc = env.on_every_rank(share, "corpus_roles", group)
    _sum_over_ranks(acc, group)
    return acc.result(lm.model_id, lm.revision)


def _check_kinds(acc: RoleAccumulator) -> None:
    from attnlab.maps.records import WORD_KINDS

    if not acc.kinds <= set(WORD_KINDS):
        raise ValueError(f"corpus_roles: word kinds {sorted(acc.kinds - set(WORD_KINDS))} are not among {WORD_KINDS}; "
                         "they cannot be summed over ranks")


def _sum_over_ranks(acc: RoleAccumulator, group: Any) -> None:
    """Make ``acc`` the accumulator of every rank's sentences (in place), with one all-reduce.

    Totals, row and sentence counts, and the sums of per-sentence means add up; "every map was causal" holds if it held on every rank,
    "a word repeats" if it did on one; the word kinds seen are the union (of the fixed list of
    kinds, so that they travel as counts).
    """
    from attnlab.distributed import env
    from attnlab.maps.records import WORD_KINDS

    names = list(acc.totals)
    flags = [acc.sentences, float(not acc.causal), float(acc.repeats)] + [float(k in acc.kinds) for k in WORD_KINDS]
    k = len(names)
    *arrays, rows, counts, flags = env.all_reduce_sum(
        [acc.totals[n] for n in names] + [acc.sentence_means[n] for n in names]
        + [[acc.rows[n] for n in names], [acc.sentence_counts[n] for n in names], flags], group)
    acc.totals, acc.sentence_means = dict(zip(names, arrays[:k])), dict(zip(names, arrays[k:]))
    acc.rows = {n: int(round(r)) for n, r in zip(names, rows)}
    acc.sentence_counts = {n: int(round(c)) for n, c in zip(names, counts)}
    acc.sentences = int(round(flags[0]))
    acc.causal, acc.repeats = flags[1] == 0, flags[2] > 0
    acc.kinds = {k for k, c in zip(WORD_KINDS, flags[3:]) if c > 0}
