"""What the CLI and the viewer ask the circuit tools in words: a target token named by its text, two
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


def token_id(tokenizer: Any, text: str, argument: str = "target") -> int:
    """The id of ``text`` where it is exactly one token of the tokenizer's vocabulary, read as it
    would be in running text (no special tokens added: " Paris", with its space, for a byte-level BPE)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) == 1:
        return int(ids[0])
    if not ids:
        raise ValueError(f"{argument} {text!r} is no token at all; give one token of the model, e.g. ' the'")
    split = " + ".join(repr(p) for p in pieces(tokenizer, ids))
    raise ValueError(f"{argument} {text!r} is {len(ids)} tokens of this model ({split}), not one; give a single "
                     f"token, such as {pieces(tokenizer, ids[:1])[0]!r}")


def encode(tokenizer: Any, text: str, max_tokens: int, argument: str = "text") -> list[int]:
    """``text`` as the model reads it (with the special tokens its tokenizer adds), at most ``max_tokens`` ids."""
    if not text.strip():
        raise ValueError(f"{argument} is empty; give the text the model reads")
    ids = [int(i) for i in tokenizer(text)["input_ids"]]
    if len(ids) > max_tokens:
        raise ValueError(f"{argument} has {len(ids)} tokens; this model takes at most {max_tokens}")
    return ids


def encode_pair(tokenizer: Any, clean: str, corrupted: str, max_tokens: int,
                arguments: tuple[str, str] = ("clean", "corrupted")) -> tuple[list[int], list[int]]:
    """The ids of ``clean`` and ``corrupted``, which must have as many tokens: patching puts each
    activation of the clean run back at the same position of the corrupted one."""
    a, b = (encode(tokenizer, text, max_tokens, name) for text, name in zip((clean, corrupted), arguments))
    if len(a) != len(b):
        shown = "; ".join(f"{name}: {' '.join(repr(p) for p in pieces(tokenizer, ids))}"
                          for name, ids in zip(arguments, (a, b)))
        raise ValueError(f"{arguments[0]} has {len(a)} tokens and {arguments[1]} has {len(b)}; patching lines the "
                         f"two runs up position by position, so they need the same number of tokens ({shown})")
    return a, b


def target_ids(tokenizer: Any, target: str, baseline: str | None,
               arguments: tuple[str, str] = ("target", "baseline")) -> tuple[int, int | None]:
    """The ids of ``target`` and of ``baseline`` (None: no baseline), which must be different tokens."""
    t = token_id(tokenizer, target, arguments[0])
    if baseline is None:
        return t, None
    b = token_id(tokenizer, baseline, arguments[1])
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
