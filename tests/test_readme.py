"""The README's two commands are the project's promise; CI must run the second one verbatim."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text)


def test_readme_has_two_commands_lesson_then_tests():
    lesson, tests = readme_commands()[:2]
    assert lesson.endswith("attnlab lesson")
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == readme_commands()[1]


def test_the_readme_is_short_and_leaves_the_details_to_the_guides():
    """A newcomer's page: what attnlab is, the two commands, a tour, the links (issue 20: it was 459
    lines of dense prose)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160
    assert text.count("](docs/") >= 8
