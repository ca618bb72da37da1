"""What the CLI and the viewer ask the circuit tools in words: target tokens named by their text, two
texts that patching can line up position by position, and the logit (difference) they measure.

The library's tools (:func:`attnlab.patch`, :func:`attnlab.logit_attribution`) take token ids and a
metric; ``attnlab patch``, ``attnlab attribute`` and the viewer's /api/patch and /api/attribute take
text, and turn it into those here, one way for all of them. Each check raises a ``ValueError`` that
names the argument as its caller calls it (``argument=``: "--target" in the CLI, "target" in the API).
"""

from __future__ import annotations

from typing import Any


def pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token of ``ids`` as its own text (byte-level tokens decoded one by one), for messages."""
    return [tokenizer.decode([i]) for i in ids]


def check_texts(texts: dict[str, str]) -> None:
    """Each text given (not empty, not only spaces), and no two the same: {argument: text}. Needs no
    model, so that a command can check them before it loads one."""
    for argument, text in texts.items():
        if not text.strip():
            raise ValueError(f"{argument} is empty; give the text the model reads")
    if len(texts) == 2 and len(set(texts.values())) == 1:
        a, b = texts
        raise ValueError(f"{a} and {b} are the same text; patching needs a {b} text that changes what the model "
                         "predicts (the same number of tokens, a few of them different)")


def encode(tokenizer: Any, text: str, max_tokens: int, argument: str = "text") -> list[int]:
    """``text`` as the model reads it (with the special tokens its tokenizer adds), at most ``max_tokens`` ids."""
    check_texts({argument: text})
    ids = [int(i) for i in tokenizer(text, verbose=False)["input_ids"]]  # the length is checked here, in our words
    if len(ids) > max_tokens:
        raise ValueError(f"{argument} has {len(ids)} tokens; this model takes at most {max_tokens}")
    return ids


def encode_pair(tokenizer: Any, clean: str, corrupted: str, max_tokens: int,
                arguments: tuple[str, str] = ("clean", "corrupted")) -> tuple[list[int], list[int]]:
    """The ids of ``clean`` and ``corrupted``, which must have as many tokens: patching puts each
    activation of the clean run back at the same position of the corrupted one."""
    check_texts(dict(zip(arguments, (clean, corrupted))))
    a, b = (encode(tokenizer, text, max_tokens, name) for text, name in zip((clean, corrupted), arguments))
    if len(a) != len(b):
        shown = "; ".join(f"{name}: {' '.join(repr(p) for p in pieces(tokenizer, ids))}"
                          for name, ids in zip(arguments, (a, b)))
        raise ValueError(f"{arguments[0]} has {len(a)} tokens and {arguments[1]} has {len(b)}; patching lines the "
                         f"two runs up position by position, so they need the same number of tokens ({shown})")
    return a, b


def target_ids(model: Any, target: str, baseline: str | None,
               arguments: tuple[str, str] = ("target", "baseline")) -> tuple[int, int | None]:
    """The ids of ``target`` and of ``baseline`` (None: no baseline), each exactly one token of the
    model's tokenizer (read as in running text: " Paris", with its space), and different tokens."""
    from attnlab.interventions.attribution import token_id

    t = token_id(model, target, arguments[0])
    if baseline is None:
        return t, None
    b = token_id(model, baseline, arguments[1])
    if b == t:
        raise ValueError(f"{arguments[1]} {baseline!r} is the same token as {arguments[0]} {target!r}; their logit "
                         f"difference is always 0: give another token, or leave {arguments[1]} out")
    return t, b


def logit_metric(target: int, baseline: int | None = None, position: int = -1) -> Any:
    """``metric(logits [B, T, V]) -> [B]``: the logit of ``target`` at ``position`` (default the last),
    minus that of ``baseline`` when one is given."""

    def metric(logits: Any) -> Any:
        at = logits[:, position]  # [B, V]
        return at[:, target] - (0 if baseline is None else at[:, baseline])

    return metric


def describe(tokenizer: Any, target: int, baseline: int | None) -> str:
    """The metric in words: "logit of ' list'" or "logit difference ' list' − ' dict'"."""
    t = repr(tokenizer.decode([target]))
    return f"logit of {t}" if baseline is None else f"logit difference {t} − {tokenizer.decode([baseline])!r}"
