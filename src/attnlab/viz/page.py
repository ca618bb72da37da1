"""The viewer as one self-contained HTML file: the page's CSS and JS inlined, the data as JSON.

The same static files the server serves (``static/``), so the file shows the same views; it needs
no server and no network (bertviz's pages, which load their scripts from a CDN, are blank
offline). Every head of every sentence is embedded, packed as uint16 (see
:func:`attnlab.viz.payload.pack_weights`): a 512-token sentence of a 6 × 12 model makes a file of
about 50 MB, a ten-word one a few hundred kB.
"""

from __future__ import annotations

import html
import json
import os
import re
from pathlib import Path
from typing import Any

from attnlab.maps.records import Maps
from attnlab.maps.tokens import AttentionMaps
from attnlab.viz import payload
from attnlab.viz.assets import read_static
from attnlab.viz.neuron import neuron_payload
from attnlab.viz.rollout_view import page_rollout

DATA_ID = "attnlab-data"
NOTEBOOK_HEIGHT = 760  # px of the notebook frame
MAX_PAGE_BYTES = 500 * 10**6  # the packed weights a self-contained page may embed (a 1,024-token 6 × 12 model: 201 MB)


def page_data(maps: Maps | None = None, *, scene: dict | None = None, target: str | None = None,
              deciders: list[str] | None = None, overview: int = payload.DEFAULT_OVERVIEW,
              neuron: AttentionMaps | None = None, generation: dict | None = None) -> dict:
    """The data a page embeds: the scene, the maps (with every head packed) and the head search.

    ``maps``: token-level AttentionMaps or word-level WordMaps (or None for the scene alone).
    ``scene``: the lesson's scene (``attnlab.lesson.scene.scene()``), handed in by the caller (the
    viewer sits below the lesson); None leaves the Scene view out.
    ``target`` and ``deciders`` (one per sentence) add the Compare view's head search.
    ``neuron``: token-level AttentionMaps captured with ``qk=True`` (default: ``maps`` when it has
    queries) add the Neuron view.
    ``generation``: the steps of a generation (:func:`attnlab.viz.generation.steps_payload`) add the
    Generation view.
    """
    data: dict[str, Any] = {"scene": scene, "maps": None, "search": None}
    if generation is not None:
        data["generation"] = generation
    with_qk = neuron if neuron is not None else maps
    qk = None if with_qk is None else neuron_payload(with_qk)
    if qk is not None:
        data["neuron"] = qk
    if maps is not None:
        _check_size(maps)
        data["maps"] = payload.maps_payload(maps, overview=overview)
        data["maps"]["packed"] = [payload.pack_weights(w) for w in maps.weights]
        shares = maps.self_attention.sink_share  # learned sinks: [L, H, T] per sentence, packed as the weights
        if shares is not None:
            data["maps"]["sink_share"] = [payload.pack_weights(s) for s in shares]
        data["rollout"] = page_rollout(maps)  # at residual 0.5; flow through all layers where short
        seq2seq = payload.seq2seq_payload(maps)  # an encoder–decoder's decoder and cross-attention
        if seq2seq is not None:
            data["maps"]["seq2seq"] = seq2seq
    if target is not None:
        if maps is None or deciders is None:
            raise ValueError("target needs maps and deciders (one decider per sentence) for the head search")
        data["search"] = payload.find_head_payload(maps, target, list(deciders))
    return data


def _check_size(maps: Maps) -> None:
    """Refuse, before packing, a page whose weights alone would pass :data:`MAX_PAGE_BYTES` (each weight
    packs as 2 bytes, 8/3 in base64, and the page's text is built in memory twice over)."""
    weights = sum(int(rec.weights[i].size) for _, rec in maps.attentions() for i in range(len(maps)))
    needed = weights * 8 // 3
    if needed > MAX_PAGE_BYTES:
        from attnlab.maps.long import size_text

        raise ValueError(f"a self-contained page of these maps would hold {size_text(needed)} of packed weights, over "
                         f"the limit of {size_text(MAX_PAGE_BYTES)}; write the long view's page instead "
                         f"(attnlab.capture_long, then attnlab.viz.longpage.write_long_html), or serve them")


def _inline_json(data: dict) -> str:
    # No "<" at all inside the <script> element ("</script" would end it, "<!--" changes how it is
    # parsed); "\u003c" is the same character to JSON.parse.
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def render_page(data: dict, title: str = "attnlab viewer", page_file: str = "index.html") -> str:
    """``page_file`` (index.html, or long.html: the long view) with its stylesheet and scripts inlined and
    ``data`` embedded before them."""
    page = read_static(page_file)
    page = re.sub(r"<title>[^<]*</title>", lambda _: f"<title>{html.escape(title)}</title>", page, count=1)
    page = re.sub(r'<link rel="stylesheet" href="([\w.]+)">',
                  lambda m: f"<style>\n{read_static(m.group(1))}</style>", page)
    scripts = re.findall(r'<script src="([\w.]+)"></script>', page)
    for i, name in enumerate(scripts):
        code = read_static(name)
        if "</script" in code:
            raise RuntimeError(f"static/{name} contains '</script', which would end its inlined <script> early")
        embed = f'<script type="application/json" id="{DATA_ID}">{_inline_json(data)}</script>\n' if i == 0 else ""
        page = page.replace(f'<script src="{name}"></script>', f"{embed}<script>\n{code}</script>")
    return page


def _title(maps: Maps) -> str:
    first = payload.sentence_text(maps.sentences[0])
    return f"attnlab · {maps.model_id} · {first[:60]}"


def maps_html(maps: Maps, *, scene: dict | None = None, target: str | None = None,
              deciders: list[str] | None = None, neuron: AttentionMaps | None = None) -> str:
    """The self-contained page of captured maps (head view first, then model view, scene, compare,
    and the neuron view when the maps, or ``neuron``, hold queries and keys)."""
    return render_page(page_data(maps, scene=scene, target=target, deciders=deciders, neuron=neuron), title=_title(maps))


def write_maps_html(maps: Maps, path: str | os.PathLike, *, scene: dict | None = None, target: str | None = None,
                    deciders: list[str] | None = None, neuron: AttentionMaps | None = None) -> Path:
    """Write :func:`maps_html` to ``path`` (``.html`` appended when it has no suffix); returns the path."""
    return _write(maps_html(maps, scene=scene, target=target, deciders=deciders, neuron=neuron), path)


def write_page(text: str, path: str | os.PathLike) -> Path:
    """Write a rendered page to ``path`` (``.html`` appended when it has no suffix); returns the path."""
    return _write(text, path)


def _write(text: str, path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.suffix:
        path = path.with_suffix(".html")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot write {str(path)!r}: folder {str(path.parent)!r} does not exist")
    path.write_text(text, encoding="utf-8")
    return path


def write_generation_html(steps: dict, path: str | os.PathLike) -> Path:
    """Write the page of one generation (the Generation view, every step embedded) to ``path``
    (``.html`` appended when it has no suffix); ``steps`` from :func:`attnlab.viz.generation.steps_payload`."""
    title = f"attnlab · {steps['model']['id']} · generation of {len(steps['steps'])} tokens"
    return _write(render_page(page_data(generation=steps), title=title), path)


def notebook_html(maps: Maps) -> str:
    """The page in an ``<iframe srcdoc>`` for a notebook cell: its scripts and styles stay inside
    the frame, so several outputs in one notebook do not interfere, and nothing is fetched."""
    doc = html.escape(maps_html(maps), quote=True)
    return (f'<iframe srcdoc="{doc}" title="{html.escape(_title(maps))}" '
            f'style="width:100%;height:{NOTEBOOK_HEIGHT}px;border:1px solid #ddd"></iframe>')
