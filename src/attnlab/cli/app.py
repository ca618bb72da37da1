"""`attnlab …`: the typer app, its commands, and the entry point.

Each command is a thin handler in the module of its group (:mod:`attnlab.cli.lesson`,
:mod:`attnlab.cli.maps`, :mod:`attnlab.cli.serve`, :mod:`attnlab.cli.measure`): it parses flags into
a library call and prints the result; what every command shares is in :mod:`attnlab.cli.common`.
``--json PATH`` writes a command's result as JSON to PATH (``-``: stdout, and no tables). Bad input
ends in one line, ``error: …``, and exit status 2; a failure of attnlab's own in one line that says
so, and exit status 1; never a traceback (set ATTNLAB_DEBUG=1 to see one): :mod:`attnlab.cli.errors`.
"""

from __future__ import annotations

import inspect
import os
import sys

import typer
from rich.markup import escape

from attnlab.cli import ablate, circuits, generate, kv, lesson, longinputs, maps, measure, serve
from attnlab.cli import plan as plan_cli
from attnlab.cli.common import console, err
from attnlab.cli.errors import (INTERNAL, REPORT, USAGE, click_error, command_flags, in_flags, is_input_error,
                                non_utf8_argument)

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
    "patch": circuits.patch, "attribute": circuits.attribute,
    "serve": serve.serve, "lesson": lesson.lesson, "cost": lesson.cost, "plan": plan_cli.plan, "check": measure.check,
    "bench": measure.bench, "kv": kv.kv,
}
for _name, _handler in COMMANDS.items():
    # the list in `attnlab --help` shows each docstring's first paragraph; typer's rich mode keeps its line breaks
    # there (mid-sentence), so it gets the paragraph as one line
    app.command(_name, short_help=" ".join(inspect.cleandoc(_handler.__doc__ or "").split("\n\n")[0].split()))(_handler)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit status: 0, 2 for the user's mistake (one line, ``error: …``),
    1 for attnlab's (one line that says so); :mod:`attnlab.cli.errors` tells them apart."""
    argv = sys.argv[1:] if argv is None else list(argv)
    group = typer.main.get_command(app)
    try:
        if (bad := non_utf8_argument(argv)) is not None:
            raise ValueError(bad)
        result = group.main(args=argv, prog_name="attnlab", standalone_mode=False)
        return result if isinstance(result, int) else 0  # typer.Exit(n) comes back as n
    except KeyboardInterrupt:
        err.print("aborted")
        return 130
    except BrokenPipeError:  # `attnlab … --json - | head`: the reader left; nothing to tell it
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the interpreter's flush at exit)
        return 1
    except Exception as e:  # noqa: BLE001 (each kind is told apart below)
        if os.environ.get("ATTNLAB_DEBUG"):
            raise
        if click_error(e, "NoArgsIsHelpError"):  # `attnlab` alone: the help, and 2, as no command is a usage error
            console.print(e.format_message(), highlight=False, markup=False)
            return USAGE
        if click_error(e, "UsageError"):  # the parser's, in click's words, which name the flag
            return _say(f"error: {e.format_message()}", USAGE)
        if click_error(e, "Abort"):
            err.print("aborted")
            return 130
        if is_input_error(e):
            return _say(f"error: {in_flags(str(e), command_flags(group, argv))}", USAGE)
        return _say(f"internal error: {type(e).__name__}: {e} ({REPORT}; ATTNLAB_DEBUG=1 shows the traceback)",
                    INTERNAL)


def _say(line: str, status: int) -> int:
    """One line on stderr whatever the width; escaped, or rich would take "[sep]" in it for markup."""
    kind, _, rest = line.partition(": ")
    err.print(f"[bold red]{kind}:[/] {escape(' '.join(rest.split()))}", highlight=False, soft_wrap=True)
    return status


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
