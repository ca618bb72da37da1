"""What a learner reads: numbers in plain notation, tables that read at 80 columns, titles that say
what their section does, a README and a lesson that stand alone (no paths outside the repository),
and a README tour that runs as printed with the example corpus that ships."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnlab.lesson.fmt import mb, ms

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
OUTSIDE = ("../", "shared/seeds", "seed 000", "seed 001", "listing 2.8", "DESIGN.md")


@pytest.mark.parametrize("seconds, text", [(1.3, "1,300 ms"), (1.2999, "1,300 ms"), (12.5, "12,500 ms"),
                                           (0.0123456, "12.3 ms"), (0.0995, "99.5 ms"), (0.9997, "1,000 ms")])
def test_times_print_in_plain_notation(seconds, text):
    assert ms(seconds) == text


@given(st.floats(min_value=1e-7, max_value=1e5))
def test_ms_and_mb_never_use_exponents_and_keep_three_digits(x):
    for text, value in ((ms(x), 1000 * x), (mb(x * 1e9), x * 1e3)):
        assert "e" not in text.split()[0]
        back = float(text.split()[0].replace(",", ""))
        assert abs(back - value) <= 0.005 * value + 1e-12  # three significant digits


def cheap_sections():
    from attnlab.lesson.formula import formula_section, qkv_section
    from attnlab.lesson.heads import heads_section
    from attnlab.lesson.nextsteps import next_section

    model = {"model_id": "sentence-transformers/all-MiniLM-L6-v2", "num_layers": 6, "num_heads": 12, "hidden_size": 384}
    return [formula_section(), qkv_section(0), heads_section(model), next_section(0)]


def rendered(table, width: int = 80) -> list[str]:
    """A lesson table as `attnlab lesson` prints it (rich, cells folded when too long) at ``width`` columns."""
    from rich.console import Console

    from attnlab.cli.lesson import rich_table

    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    console.print(rich_table(table))
    return console.export_text().splitlines()


def test_the_heads_table_reads_at_80_columns():
    """No cell is cut inside a word ("sentenc / e-trans / formers"): every word of every cell is
    found whole on one printed line."""
    section = next(s for s in cheap_sections() if s.key == "heads")
    for table in section.tables:
        lines = rendered(table)
        assert max(len(line) for line in lines) <= 80
        for cell in (c for row in table.rows for c in row):
            for word in cell.split():
                assert any(word in line for line in lines), (table.title, cell, word)


def test_section_7_is_named_for_what_it_shows():
    section = next(s for s in cheap_sections() if s.key == "next")
    title = section.title.lower()
    assert "what comes next" not in title
    for subject in ("order", "causal", "hid"):  # hidden / hiding
        assert subject in title
        assert any(subject in f.lower() for f in section.findings)  # the title names what the section checks


def lesson_text(sections) -> str:
    parts = []
    for s in sections:
        parts += [s.title, *s.findings]
        for t in s.tables:
            parts += [t.title, *t.columns, *(c for row in t.rows for c in row)]
    return "\n".join(parts)


def test_the_lesson_speaks_for_itself():
    text = lesson_text(cheap_sections())
    for ref in OUTSIDE:
        assert ref not in text
    # "seed" only as a random generator's seed, never as a document the reader does not have.
    for m in re.finditer(r"\bseed\b", text):
        assert text[max(0, m.start() - 10):m.start()].rstrip().endswith(("random", "generator")), text[m.start() - 40:m.end() + 40]
    sources = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "src/attnlab/lesson").glob("*.py"))
    for ref in ("../shared", "seed 00", "listing 2.8", "Listing 2.8"):
        assert ref not in sources


def test_the_readme_stands_alone():
    for ref in OUTSIDE:
        assert ref not in README, ref
    assert "the lesson" in README.lower() and "listing" in README.lower()  # it says what the lesson is
    # Every repository path the README names exists in the clone.
    paths = set(re.findall(r"`((?:src|benchmarks|examples|docs|scripts|tests)/[\w./-]+)`", README))
    paths |= set(re.findall(r"\]\(((?:docs|benchmarks|examples)/[\w./-]+)\)", README))
    assert paths
    missing = [p for p in sorted(paths) if not (ROOT / p).exists()]
    assert not missing


def test_the_example_corpus_ships_and_reads():
    from attnlab.interventions.corpus import read_corpus

    items = read_corpus(ROOT / "examples/sentences.txt")
    assert len(items) >= 30 and len(set(items)) == len(items)
    assert all(isinstance(s, str) and s[0].isupper() and s[-1] in ".?!" for s in items)


@pytest.mark.model
def test_the_readme_heads_tour_runs_as_printed(tmp_path, monkeypatch, default_model):
    import json

    from attnlab.cli.app import main

    line = next(l for l in README.splitlines() if "attnlab heads --corpus" in l)
    args = shlex.split(line.split("#")[0].strip().lstrip("$ "))
    assert args[0].endswith("attnlab") and args[1] == "heads"
    args = args[1:]
    args[args.index("--json") + 1] = str(tmp_path / "roles.json")
    monkeypatch.chdir(ROOT)  # as printed: run from the clone's root
    assert main(args) == 0
    roles = json.loads((tmp_path / "roles.json").read_text())
    assert roles


def test_the_report_page_says_what_the_lesson_is():
    import html as html_module

    from attnlab.lesson.report import FIGURES, render_html
    from attnlab.lesson.run import Lesson, LessonConfig

    sections = tuple(cheap_sections())
    lesson = Lesson(LessonConfig(), sections, {}, 0.0)
    pngs = {name: b"" for s in sections for name, _ in FIGURES[s.key]}
    page = html_module.unescape(render_html(lesson, pngs))
    intro = page[page.index("<h1>"):page.index("<nav>")]
    assert "A lesson on attention" in intro and "book listing" in intro and "the lesson states" in intro
    for ref in OUTSIDE:
        assert ref not in page
