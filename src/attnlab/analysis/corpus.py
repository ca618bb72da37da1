"""Corpus statistics (Clark et al. 2019, §3): every role score per head, averaged over a text file.

Sentences are captured in batches and folded into running totals one batch at a time
(:class:`~attnlab.analysis.roles.RoleAccumulator`), so memory stays that of one batch however long
the corpus is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from attnlab.analysis.roles import HeadRoles, RoleAccumulator


def read_corpus(path: str | os.PathLike) -> list[str | tuple[str, str]]:
    """One sentence per line, or a sentence pair separated by one tab; blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {str(path)!r} does not exist")
    items: list[str | tuple[str, str]] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n\r")
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) > 2 or not all(p.strip() for p in parts):
                raise ValueError(
                    f"{path}:{n}: expected a sentence or two sentences separated by one tab, got {line!r}"
                )
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
) -> HeadRoles:
    """Role scores per layer and head over many sentences (or pairs), captured batch by batch.

    ``progress(done, total)`` is called after each batch.
    """
    from attnlab.models.words import to_words
    from attnlab.models.capture import iter_capture
    from attnlab.models.loading import LoadedModel, load_model

    lm = model if isinstance(model, LoadedModel) else load_model(model, revision)
    acc = RoleAccumulator(lm.num_layers, lm.num_heads)
    for _, part in iter_capture(sentences, lm, batch_size=batch_size, progress=progress):
        acc.add(to_words(part, marks=marks))
    return acc.result(lm.model_id, lm.revision)
