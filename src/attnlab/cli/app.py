"""`attnlab …`: the typer app, its commands, and the entry point.

Each command is a thin handler in the module of its group (:mod:`attnlab.cli.lesson`,
:mod:`attnlab.cli.maps`, :mod:`attnlab.cli.serve`, :mod:`attnlab.cli.measure`): it parses flags into
a library call and prints the result; what every command shares is in :mod:`attnlab.cli.common`.
``--json PATH`` writes a command's result as JSON to PATH (``-``: stdout, and no tables). Bad input
ends in one line, ``error: …``, and exit status 2, never a traceback (set ATTNLAB_DEBUG=1 to see one).
"""

from __future__ import annotations

import os
import sys

import typer
from rich.markup import escape

from attnlab.cli import ablate, generate, lesson, longinputs, maps, measure, serve
from attnlab.cli.common import err

app = typer.Typer(
    name="attnlab",
    help="Attention end to end: compute it, look inside real models, learn it, measure its cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Attention end to end: compute it, look inside real models, learn it, measure its cost."""


COMMANDS = {  # in the order --help lists them
    "scene": lesson.scene, "maps": maps.maps, "heads": maps.heads, "find-head": maps.find_head,
    "generate": generate.generate, "stats": longinputs.stats, "rollout": longinputs.rollout, "ablate": ablate.ablate,
    "serve": serve.serve, "lesson": lesson.lesson, "cost": lesson.cost, "check": measure.check, "bench": measure.bench,
}
for _name, _handler in COMMANDS.items():
    app.command(_name)(_handler)


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
        # one line whatever the width; the message escaped, or rich would take "[sep]" in it for markup
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        return 2
    return 0


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
