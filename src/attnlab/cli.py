"""`attnlab …`: the command line. Thin wrappers: the work happens in the library, the printing here.

Every command that computes something can also hand it over as JSON (``--json``). Bad input
ends in one line, ``error: …``, and exit status 2, never a traceback (set ATTNLAB_DEBUG=1 to see
one).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from attnlab.lesson.fmt import pct, vec  # one rounding for the lesson, its page and the CLI

app = typer.Typer(
    name="attnlab",
    help="Attention end to end: compute it, look inside real models, learn it, measure its cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err = Console(stderr=True)


def emit_json(data: Any) -> None:
    """JSON to stdout, nothing else, so that `attnlab … --json | jq` works."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


@app.callback()
def _root() -> None:
    """Attention end to end: compute it, look inside real models, learn it, measure its cost."""


# ---------------------------------------------------------------- scene


@app.command()
def scene(as_json: bool = typer.Option(False, "--json", help="Print the scene as JSON instead of tables.")) -> None:
    """The lesson's scene: the query of "bank" over "I sat on the bank of the river"."""
    from attnlab.lesson.scene import scene as compute

    data = compute()
    if as_json:
        emit_json(data)
        return
    un, sc = data["unscaled"], data["scaled"]
    table = Table(title='The query of "bank" q = (1, 1) over "I sat on the bank of the river" (d = 2)')
    for col in ("token", "key k", "q·k", "weight", "q·k / √2", "weight (scaled)"):
        table.add_column(col, justify="left" if col == "token" else "right")
    for i, tok in enumerate(data["tokens"]):
        table.add_row(
            tok, vec(data["keys"][i], 1), f"{un['scores'][i]:.2f}", pct(un["weights"][i]),
            f"{sc['scores'][i]:.2f}", pct(sc["weights"][i]),
        )
    console.print(table)
    axes = ", ".join(data["value_axes"])
    console.print(f"blended vector ({axes}):")
    console.print(f"  unscaled         {vec(un['output'])}")
    console.print(f"  scaled by 1/√2   {vec(sc['output'])}")


# ---------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit status; errors become one readable line."""
    try:
        app(args=argv, prog_name="attnlab")  # usage errors: typer prints them and exits 2
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        err.print("aborted")
        return 130
    except (ValueError, TypeError, OSError, LookupError, RuntimeError) as e:
        if os.environ.get("ATTNLAB_DEBUG"):
            raise
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        return 2
    return 0


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
