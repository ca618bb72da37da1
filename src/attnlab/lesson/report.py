"""The lesson's report folder: ``index.html`` (one self-contained page), the figures as PNG,
``lesson.json`` (every number; schema in ``lesson/schema.json``) and ``viewer.html``, the viewer's
self-contained page on the lesson's two "bank" sentences (every head, explorable offline).

The page needs no network: figures are embedded as base64 PNG (and also written beside it),
styles are inline, and there is no script.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
from pathlib import Path

from attnlab.lesson.run import Lesson
from attnlab.lesson.section import Section, Table

log = logging.getLogger(__name__)

DPI = 110
SCHEMA_PATH = Path(__file__).with_name("schema.json")


# Section key → [(PNG file name, function of attnlab.viz.figures drawing it from the section's data)].
FIGURES: dict[str, list[tuple[str, str]]] = {
    "formula": [("1_scene_weights.png", "scene_weights")],
    "qkv": [("2_qkv_maps.png", "qkv_maps"), ("2_dot_vs_additive.png", "dot_vs_additive")],
    "scaling": [("3_scaling.png", "scaling")],
    "heads": [("4_head_costs.png", "head_costs")],
    "maps": [("5_bank_head.png", "bank_head"), ("5_role_heads.png", "role_heads")],
    "cost": [("6_cost.png", "cost_curves"), ("6_serving.png", "planplot:serving_figure")],
    "next": [("7_next.png", "next_maps")],
    "transformer": [("8_induction.png", "induction:induction_training"), ("8_circuit.png", "induction:induction_circuit")],  # "module:function" in attnlab.viz
}


def lesson_json(lesson: Lesson) -> dict:
    """``lesson.json``: the lesson's numbers plus the names of the figures the report draws."""
    return dict(lesson.to_dict(), figures={s.key: [name for name, _ in FIGURES[s.key]] for s in lesson.sections})


def render_figures(lesson: Lesson) -> dict[str, bytes]:
    """PNG bytes of every figure, by file name."""
    import importlib  # matplotlib loads with the figure modules, here, not at import

    out = {}
    for section in lesson.sections:
        for name, draw in FIGURES[section.key]:
            module, _, function = draw.rpartition(":")
            figures = importlib.import_module(f"attnlab.viz.{module or 'figures'}")
            buf = io.BytesIO()
            getattr(figures, function)(section.data).savefig(buf, format="png", dpi=DPI)
            out[name] = buf.getvalue()
    return out


def _table_html(t: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in t.rows)
    return f"<table><caption>{html.escape(t.title)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _section_html(s: Section, pngs: dict[str, bytes]) -> str:
    parts = [f'<section id="{s.key}"><h2>{s.number}. {html.escape(s.title)}</h2>']
    parts += [f"<p>{html.escape(f)}</p>" for f in s.findings]
    parts += [_table_html(t) for t in s.tables]
    for name, _ in FIGURES[s.key]:
        data = base64.b64encode(pngs[name]).decode("ascii")
        parts.append(f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{data}">'
                     f"<figcaption>{html.escape(name)}</figcaption></figure>")
    return "\n".join(parts) + "</section>"


CSS = """
body { font: 15px/1.5 system-ui, sans-serif; max-width: 1150px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } .meta { color: #666; }
nav a { margin-right: 1em; }
section { border-top: 1px solid #ddd; margin-top: 2em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }
caption { text-align: left; font-weight: 600; padding-bottom: 0.3em; }
th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead { background: #f3f3f3; }
img { max-width: 100%; } figcaption { color: #888; font-size: 12px; }
"""


VIEWER = "viewer.html"

ABOUT = (
    "A lesson on attention, computed rather than told. The lesson follows one scene, the word \"bank\" in "
    "\"I sat on the bank of the river\" looking at the other words, through eight steps: the formula on that "
    "scene, where Q, K and V come from (with a book listing of a multi-head attention implementation in NumPy, "
    "made to run), why the scores are divided by √d_k, what several heads cost, the real maps of a pretrained "
    "model, what attention costs as the context grows, three properties of the mechanism, and the transformer "
    "around it, a small one trained on the CPU until an induction head appears. Every number the "
    "lesson states is recomputed here by attnlab and shown beside the lesson's own figure (\"the lesson "
    "states\"); where they differ, the page says so."
)


def render_html(lesson: Lesson, pngs: dict[str, bytes]) -> str:
    cfg = lesson.config
    nav = " ".join(f'<a href="#{s.key}">{s.number}. {html.escape(s.title)}</a>' for s in lesson.sections)
    if lesson.maps is not None:
        nav += f' <a href="{VIEWER}">Explore every head in the viewer</a>'
    meta = (f"model {html.escape(lesson.section('heads').data['model']['model_id'])} · random seed {cfg.seed} · "
            f"deadline {cfg.deadline_ms:g} ms · memory {cfg.memory_mb:g} MB · computed in {lesson.elapsed_s:.1f} s · "
            "every number is also in lesson.json")
    body = "\n".join(_section_html(s, pngs) for s in lesson.sections)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>attnlab: the attention lesson</title>'
            f"<style>{CSS}</style></head><body><h1>Attention, the lesson, computed</h1>"
            f'<p class="meta">{meta}</p><p>{html.escape(ABOUT)}</p><nav>{nav}</nav>\n{body}\n</body></html>\n')


def write_report(lesson: Lesson, out: str | Path | None = None) -> list[Path]:
    """Write index.html, the PNGs and lesson.json into ``out`` (default: the lesson's ``config.out``)."""
    out = Path(lesson.config.out if out is None else out)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"out must be a folder, got the file {out}")
    out.mkdir(parents=True, exist_ok=True)
    pngs = render_figures(lesson)
    written = []
    for name, data in pngs.items():
        (out / name).write_bytes(data)
        written.append(out / name)
    (out / "lesson.json").write_text(json.dumps(lesson_json(lesson), indent=1) + "\n")
    (out / "index.html").write_text(render_html(lesson, pngs))
    written += [out / "lesson.json", out / "index.html"]
    if lesson.maps is not None:
        from attnlab.lesson.realmaps import DECIDERS, TARGET
        from attnlab.lesson.scene import scene
        from attnlab.viz.page import write_maps_html

        words = lesson.maps.to_words()
        written.append(write_maps_html(words, out / VIEWER, scene=scene(), target=TARGET, deciders=list(DECIDERS)))
    log.info("report written to %s", out)
    return written
