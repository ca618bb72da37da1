"""Every code block of the README and the guides under docs/ marked runnable runs as printed, so that
no example can rot: a fenced block whose info string is ``console runnable`` (each ``$ `` line an
attnlab command, run through the CLI in this interpreter, exit status 0) or ``python runnable`` (run
as a script). Each block runs from a fresh folder that holds the clone's ``examples/``, as a reader
in the clone's root would, so the files it writes land there. Long examples are shown but not
marked, with how long they take; the runnable ones take seconds each."""

from __future__ import annotations

import re
import runpy
import shlex
from pathlib import Path

import pytest

from attnlab.cli.app import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(\w+) runnable\n(.*?)^```$", re.M | re.S)
GUIDES = ("attention", "maps", "long-inputs", "transformer", "generation", "viewer", "distributed", "benchmarks",
          "lesson")
NO_MODEL = ("scene", "bench", "check", "cost")  # commands that load no model


def runnable_blocks() -> list[tuple[str, str, str]]:
    """(where, kind, text) of every block marked runnable; ``where`` is page:line."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            where = f"{page.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}"
            found.append((where, m.group(1), m.group(2)))
    return found


def commands(text: str) -> list[list[str]]:
    """The ``$ `` lines of a console block (a trailing backslash continues one), split as a shell would."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [shlex.split(line[2:], comments=True) for line in joined.splitlines() if line.startswith("$ ")]


def needs_model(kind: str, text: str) -> bool:
    if kind == "console":
        return any(args[1] not in NO_MODEL for args in commands(text))
    return any(word in text for word in ("capture(", "load_maps(", "Transformer", "head_stats(", "ablate("))


BLOCKS = runnable_blocks()


def test_every_guide_exists_and_the_readme_links_it():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in GUIDES:
        assert (ROOT / "docs" / f"{name}.md").is_file(), name
        assert f"(docs/{name}.md)" in readme, name


def test_runnable_blocks_are_found_on_every_page_that_has_examples():
    pages = {where.split(":")[0] for where, _, _ in BLOCKS}
    assert "README.md" in pages and len(pages) >= 8, pages
    assert len(BLOCKS) >= 15


def test_console_blocks_run_attnlab_only():
    for where, kind, text in BLOCKS:
        if kind == "console":
            assert commands(text), where
            for args in commands(text):
                assert args[0] == ".venv/bin/attnlab", (where, args)
        else:
            assert kind == "python", (where, kind)


PAGES_WITH_BLOCKS = sorted({where.split(":")[0] for where, _, _ in BLOCKS})


@pytest.mark.parametrize("page", PAGES_WITH_BLOCKS)
def test_the_runnable_blocks_of_a_page_run_as_printed(page, tmp_path, monkeypatch, request, capsys):
    """A page's blocks run in order in one fresh folder that looks like the clone's root (examples/
    is there), so a later block may read what an earlier one wrote, as a reader's would."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    blocks = [(where, kind, text) for where, kind, text in BLOCKS if where.split(":")[0] == page]
    if any(needs_model(kind, text) for _, kind, text in blocks):
        request.getfixturevalue("default_model")  # its needs, and the model loaded once per session
    for where, kind, text in blocks:
        if kind == "console":
            for args in commands(text):
                assert main(args[1:]) == 0, (where, args, capsys.readouterr().err)
            continue
        script = tmp_path / "example.py"
        script.write_text(text, encoding="utf-8")
        try:
            runpy.run_path(str(script), run_name="__main__")
        except Exception as e:  # noqa: BLE001 (which block failed, then the error)
            raise AssertionError(f"{where}: {type(e).__name__}: {e}") from e


def test_a_figure_of_spearman_says_which_estimate_it_is():
    """The ablation's Spearman figure depends on --probes: every page that gives one says which."""
    for page in PAGES:
        text = " ".join(page.read_text(encoding="utf-8").split())
        for m in re.finditer(r"Spearman[^.]*?\d\.\d\d", text):
            around = text[m.start():m.end() + 200]
            assert "estimated" in around and "exact" in around, (page.name, around)
