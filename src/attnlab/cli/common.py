"""What every command shares: the consoles, the ``--json PATH`` output, progress bars, flag parsing.

``--json PATH`` means one thing in every command: write the result as JSON to PATH; ``-`` for
stdout, and then nothing else goes to stdout (no tables), so that ``attnlab … --json - | jq`` works.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console

console = Console()
err = Console(stderr=True)

JSON_HELP = "Write the result as JSON to PATH; '-' for stdout (then no tables are printed)."
MODEL_HELP = "A model folder or a hub id (BERT/RoBERTa/GPT-2-style); default: the bundled all-MiniLM-L6-v2."
REVISION_HELP = "The hub revision (commit) to pin, for a hub id."


def json_option(help: str = JSON_HELP) -> Any:
    """The ``--json PATH`` option, the same in every command."""
    return typer.Option(None, "--json", metavar="PATH", help=help)


def write_json(path: str | None, data: Any) -> bool:
    """Write ``data`` as JSON to ``path`` or, for '-', to stdout; True when stdout took it (print nothing else)."""
    if path is None:
        return False
    if path == "-":
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return True
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    err.print(f"wrote {path}", highlight=False)
    return False


def progress(description: str):
    """A rich progress bar on stderr and the (done, total) callback that drives it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=err, transient=True)
    task = bar.add_task(description, total=None)
    return bar, lambda done, total: bar.update(task, completed=done, total=total)


def counter(update) -> Any:  # noqa: ANN001
    """A tick() for library callbacks that counts calls into ``update(done, total)``; ``.total`` may be set."""

    class Tick:
        done, total = 0, None

        def __call__(self, *_: Any) -> None:
            self.done += 1
            update(self.done, self.total)

    return Tick()


def ints(flag: str, text: str) -> tuple[int, ...]:
    """A comma-separated list of integers from a flag."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None


def names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names from a flag."""
    return tuple(x.strip() for x in text.split(",") if x.strip())
