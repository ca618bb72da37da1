"""The viewer's 422 answers: every validation error as a sentence a learner understands, in JSON
that any input can be written into.

FastAPI's own handler echoes the client's input back; a lone surrogate (``"\\ud800"``, which JSON
allows and UTF-8 cannot encode) then crashes the handler with a 500 and resets the connection. Here
the input is never echoed, and every string is made encodable first.
"""

from __future__ import annotations

import re
from typing import Any

from attnlab.transformer.sampling import TEMPERATURE_RULE

# A field that takes one of several forms (pydantic's union) fails once per form, each error's loc
# naming the form by a tag of pydantic's ("constrained-int", "list[nullable[constrained-int]]"): such
# a field gets one sentence saying every form it takes, and the tags never reach the reader.
FORMS = {
    "occurrence": ("occurrence: which occurrence of the target to search, a whole number from 1 (the first) to 1000, "
                   "or a list with one such number (or null) per sentence; leave it out to search the first"),
}
_TAG = re.compile(r"[\[\]-]")  # the request's own field names are identifiers; pydantic's tags are not


def encodable(text: str) -> str:
    """``text`` with anything UTF-8 cannot encode written as an escape: '\\ud800' → '\\\\ud800'."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _field(loc: tuple) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(encodable(p) for p in parts) or "body"


def friendly(error: dict, max_sentences: int, max_chars: int) -> str:
    """One pydantic error as a sentence; the common mistakes of the page's form in plain words."""
    loc, kind = tuple(error.get("loc", ())), error.get("type", "")
    field = _field(loc)
    top = next((str(p) for p in loc if p != "body"), "")
    if top == "sentences":
        if kind == "too_short" and len(loc) == 2:
            return "Type a sentence first: there is nothing to show yet."
        if kind == "too_long" and len(loc) == 2:
            return f"At most {max_sentences} sentences at a time."
        if kind in ("string_pattern_mismatch", "string_too_short"):
            return "A sentence is empty or only spaces: type some words."
        if kind == "string_too_long":
            return (f"A sentence may have at most {max_chars:,} characters for the full maps; a longer text goes to "
                    f"the long view (POST /api/long/info, /api/long/overview), which computes its map a tile at a time.")
    if top in ("target", "deciders") and kind in ("string_pattern_mismatch", "string_too_short", "too_short"):
        return f"{field}: type a word (it is empty)."
    if kind == "string_pattern_mismatch" and (error.get("ctx") or {}).get("pattern") == r"\S":
        return f"{field}: is only spaces; type some text."
    if top == "temperature" and kind in ("greater_than", "less_than_equal", "finite_number"):
        return f"{TEMPERATURE_RULE} (greedy decoding: leave it out)."
    if kind == "string_unicode":  # pydantic's check: a lone surrogate, half of a UTF-16 pair
        return (f"{field}: holds a character that is not valid text (half of a character pair, such as \\ud800); "
                "type or paste the text again.")
    if kind == "json_invalid":
        return "The request is not valid JSON."
    return f"{field}: {encodable(str(error.get('msg', 'invalid value')))}"


def _is_tag(part: Any) -> bool:
    return isinstance(part, str) and bool(_TAG.search(part))


def validation_detail(errors: list[dict], max_sentences: int, max_chars: int) -> list[dict[str, Any]]:
    """FastAPI's ``detail`` list (``loc``, ``msg``, ``type``) without the echoed input, every string
    encodable; a field of several forms gets one entry (:data:`FORMS`), without pydantic's tags."""
    out: list[dict[str, Any]] = []
    forms_said: set[tuple] = set()
    for e in errors:
        loc = tuple(p for p in e.get("loc", ()) if not _is_tag(p))
        if any(_is_tag(p) for p in e.get("loc", ())):
            field = loc[: 2 if loc[:1] == ("body",) else 1]
            if field in forms_said:
                continue
            forms_said.add(field)
            name = str(field[-1]) if field else "body"
            said = friendly({**e, "loc": loc}, max_sentences, max_chars)
            msg = FORMS.get(name, f"{encodable(name)}: none of the forms it takes ({said})")
            out.append({"loc": [encodable(str(p)) for p in field], "msg": msg, "type": "value_error"})
            continue
        out.append({"loc": [p if isinstance(p, int) else encodable(str(p)) for p in loc],
                    "msg": friendly(e, max_sentences, max_chars), "type": encodable(str(e.get("type", "")))})
    return out
