"""`attnlab maps` on a long text: the long view, taken by itself above a stated length, and said so."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from attnlab.cli.common import console, err, write_json

TOP = 3  # keys per head in the printed table


def needs_long_view(lm: Any, items: list) -> str | None:
    """Why ``attnlab maps`` takes the long view of ``items`` (above LONG_VIEW_TOKENS tokens, or a full map
    past MAX_MAP_BYTES), or None for the full maps. Counts tokens only: nothing runs the model."""
    from attnlab.maps import long
    from attnlab.maps.long import full_capture_bytes, size_text

    lengths = [len(lm.tokenizer(*(s if isinstance(s, tuple) else (s,)), verbose=False)["input_ids"]) for s in items]
    longest = max(lengths)
    full = full_capture_bytes(lm.num_layers, lm.num_heads, longest, len(items))
    if longest <= long.LONG_VIEW_TOKENS and full <= long.MAX_MAP_BYTES:
        return None
    return (f"{longest} tokens" + (f" (over {long.LONG_VIEW_TOKENS})" if longest > long.LONG_VIEW_TOKENS else "")
            + f": the full maps would hold about {size_text(full)} at their peak")


def long_maps(lm: Any, items: list, why: str, *, pick: Any, words: bool, png: str | None, save: str | None,
              html: str | None, json_path: str | None, compare: bool) -> None:
    """The long view of one text: what it keeps, each head's last-token top keys, and the files asked for."""
    from attnlab.hf.capture_long import capture_long
    from attnlab.maps.long import size_text

    if len(items) != 1:
        raise ValueError(f"the long view takes one text at a time ({why}); give one sentence, not {len(items)}")
    for flag, given in (("--words", words), ("--png", png), ("--target/--decider", compare)):
        if given:
            raise ValueError(f"{flag} needs the full maps, which the long view does not hold ({why}); leave it out")
    text = items[0] if isinstance(items[0], str) else "\t".join(items[0])
    long = capture_long(text, lm)
    err.print(f"note: {why}, so this is the long view: {size_text(long.nbytes)} of queries, keys and each row's "
              f"log-sum-exp instead of {size_text(long.full_bytes)} of weights; every weight is computed exactly "
              f"on request", highlight=False, markup=False, soft_wrap=True)
    if save:
        err.print(f"wrote {long.save(save)}", highlight=False)
    if html:
        from attnlab.viz.longpage import write_long_html

        page = write_long_html(long, html)
        err.print(f"wrote {page} ({size_text(page.stat().st_size)})", highlight=False)
    if write_json(json_path, long_record(long, pick)):
        return
    console.print(_table(long, pick))


def _heads(long: Any, pick: Any) -> list[tuple[int, int]]:
    if pick is not None:
        return [tuple(pick)]
    return [(layer, head) for layer in range(long.num_layers) for head in range(long.num_heads)]


def long_record(long: Any, pick: Any) -> dict:
    """JSON-ready: the text's size and, per head (0-based), the last token's top keys."""
    from attnlab.analysis.longview import top_keys

    labels, last = long.labels(), long.num_tokens - 1
    return {"model_id": long.model_id, "revision": long.revision, "view": "long", "num_tokens": long.num_tokens,
            "num_layers": long.num_layers, "num_heads": long.num_heads, "held_bytes": long.nbytes,
            "full_bytes": long.full_bytes, "query": last,
            "heads": [{"layer": layer, "head": head, "top": [
                {"key": j, "token": labels[j], "weight": round(w, 6)} for j, w in top_keys(long, layer, head, last, TOP)]}
                for layer, head in _heads(long, pick)]}


def _table(long: Any, pick: Any) -> Table:
    from attnlab.maps.heads import Head

    rec = long_record(long, pick)
    table = Table(title=f"{long.model_id}: where the last token ({long.labels()[-1]!r}, position {long.num_tokens}) "
                        f"looks in each head, top {TOP} keys (1-based positions)")
    for col in ("head", "top keys: token (position) weight"):
        table.add_column(col)
    for h in rec["heads"]:
        keys = ", ".join(f"{k['token']!r} ({k['key'] + 1}) {100 * k['weight']:.3g} %" for k in h["top"])
        table.add_row(str(Head(h["layer"], h["head"])), keys)
    return table
