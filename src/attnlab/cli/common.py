"""What every command shares: the consoles, the ``--json PATH`` output, progress bars, flag parsing.

``--json PATH`` means one thing in every command: write the result as JSON to PATH; ``-`` for
stdout, and then nothing else goes to stdout (no tables), so that ``attnlab … --json - | jq`` works.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

console = Console()
err = Console(stderr=True)



def print_table(table: Any) -> None:
    """A table at its natural width where the console is narrower (a pipe reads as 80 columns): its cells
    are figures, and rich would otherwise cut them ("128,0…") to fit."""
    from rich.measure import Measurement

    need = Measurement.get(console, console.options.update_width(1000), table).maximum
    width = console.width
    console.width = max(width, need)  # print(width=) cannot go past the console's own
    try:
        console.print(table)
    finally:
        console.width = width


JSON_HELP = "Write the result as JSON to PATH; '-' for stdout (then no tables are printed)."
MODEL_HELP = ("A model folder or a hub id (BERT/RoBERTa/GPT-2-style), or attnlab:decoder / attnlab:decoder-long "
              "(the bundled decoders); default: the bundled all-MiniLM-L6-v2.")
REVISION_HELP = "The hub revision (commit) to pin, for a hub id."
DECODER_HELP = ("A decoder's folder or hub id (GPT-2, Llama, Mistral, Qwen2, Gemma-2-style); default: attnlab:decoder, "
                "the small decoder bundled with attnlab (trained on Python's standard-library docstrings); "
                "attnlab:decoder-long is its bundled sibling with 2,048 positions (trained on the library's source).")


def model_option() -> Any:
    """``--model``, the same in every command: refused when empty, which would read as the current folder."""
    return typer.Option(None, "--model", help=MODEL_HELP, callback=not_empty("--model"))


def decoder_option() -> Any:
    """``--model`` of the commands that run attnlab's transformer on a decoder (default: attnlab:decoder)."""
    return typer.Option(None, "--model", help=DECODER_HELP, callback=not_empty("--model"))


def load_decoder(model: str | None, command: str, python: str) -> tuple[Any, str]:
    """(attnlab's transformer for ``model``, its name): None is attnlab:decoder. An encoder is refused
    from its config.json before its weights load, and a model without a tokenizer after, since the
    command takes text (``python``: the library call that takes token ids instead)."""
    import json

    from attnlab.locate.folder import DECODER, resolve
    from attnlab.transformer import Transformer
    from attnlab.transformer.config import TransformerConfig

    name = model or DECODER
    folder, model_id, _ = resolve(name)
    config = TransformerConfig.from_hf(json.loads((folder / "config.json").read_text()))
    if not config.causal:
        raise ValueError(f"--model {model!r} is a {config.family} encoder ({model_id}); {command} needs a decoder "
                         f"(leave out --model for the bundled attnlab:decoder)")
    net = Transformer.from_pretrained(name)
    if net.tokenizer is None:
        raise ValueError(f"--model {name!r} has no tokenizer; attnlab {command} takes text (use {python} with "
                         "token ids)")
    return net, name


def revision_option() -> Any:
    """``--revision``, the same in every command that loads a model."""
    return typer.Option(None, "--revision", help=REVISION_HELP, callback=not_empty("--revision"))


def not_empty(flag: str) -> Callable[[Any], Any]:
    """A typer callback that refuses an empty value (or only spaces) for ``flag`` while the arguments are parsed."""

    def check(value: Any) -> Any:
        items = value if isinstance(value, (list, tuple)) else [value]
        if any(v is not None and not str(v).strip() for v in items):
            raise ValueError(f"{flag} is empty; give {flag} a value or leave the flag out")
        return value

    return check


def out_file(flag: str, stdout: bool = False) -> Callable[[Any], Any]:
    """A typer callback that checks an output file flag while the arguments are parsed, before any
    work: not a folder, in a folder that exists and may be written. ``stdout``: '-' is allowed."""

    def check(value: Any) -> Any:
        if value is None or (stdout and str(value) == "-"):
            return value
        not_empty(flag)(value)
        path = Path(value).expanduser()
        if path.is_dir():
            raise IsADirectoryError(f"{flag} {str(value)!r} is a folder; {flag} takes a file to write")
        folder = path.parent
        if not folder.is_dir():
            raise FileNotFoundError(f"{flag} {str(value)!r}: the folder {str(folder)!r} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise PermissionError(f"{flag} {str(value)!r}: no permission to write there")
        return value

    return check


def out_folder(flag: str) -> Callable[[Any], Any]:
    """A typer callback that checks an output folder flag before any work: not a file, and the
    folder, or the nearest folder above it that exists, may be written."""

    def check(value: Any) -> Any:
        if value is None:
            return value
        not_empty(flag)(value)
        path = Path(value).expanduser()
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(f"{flag} must be a folder, got the file {str(value)!r}")
        up = path
        while not up.exists():
            up = up.parent
        if not up.is_dir() or not os.access(up, os.W_OK | os.X_OK):
            raise PermissionError(f"{flag} {str(value)!r}: no permission to write in {str(up)!r}")
        return value

    return check


def json_option(help: str = JSON_HELP) -> Any:
    """The ``--json PATH`` option, the same in every command (checked before the command runs)."""
    return typer.Option(None, "--json", metavar="PATH", help=help, callback=out_file("--json", stdout=True))


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


class PlainProgress:
    """Progress as plain lines on stderr, for when stderr is not a terminal (a log, a pipe, CI):
    a line when the step changes or its total becomes known, and at most one every :attr:`every_s`
    seconds within a step, and the last state at the end.
    It has the part of rich's ``Progress`` the commands use."""

    every_s = 5.0

    def __init__(self, description: str) -> None:
        self.tasks = [type("Task", (), {"id": 0})()]
        self.description, self.completed, self.total = description, 0, None
        self._said, self._at, self._t0 = None, 0.0, time.monotonic()

    def __enter__(self) -> "PlainProgress":
        self._say()
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None and self._said != self._line():
            self._say()

    def _line(self) -> str:
        of = "" if self.total is None else f" {self.completed}/{self.total}"
        return f"{self.description}{of}"

    def _say(self) -> None:
        self._said, self._at = self._line(), time.monotonic()
        err.print(f"{self._said} ({self._at - self._t0:.0f} s)", highlight=False, markup=False, soft_wrap=True)

    def update(self, task: Any = 0, *, description: str | None = None, completed: Any = None, total: Any = None) -> None:
        step = (description is not None and description != self.description) or (total is not None and self.total is None)
        if description is not None:
            self.description = description
        if completed is not None:
            self.completed = completed
        if total is not None:
            self.total = total
        if step or time.monotonic() - self._at >= self.every_s or self._said is None:
            self._say()


def status(text: str) -> Any:
    """A spinner with ``text`` on a terminal; elsewhere the text once, as a plain line on stderr."""
    if err.is_terminal:
        return err.status(text)
    err.print(text, highlight=False, markup=False, soft_wrap=True)
    return contextlib.nullcontext()


def progress(description: str):
    """A progress bar on stderr and the (done, total) callback that drives it: rich's bar on a
    terminal, plain lines (:class:`PlainProgress`) otherwise, so a long job is never silent."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    if not err.is_terminal:
        plain = PlainProgress(description)
        return plain, lambda done, total: plain.update(completed=done, total=total)
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


def ints(flag: str, text: str, minimum: int = 1) -> tuple[int, ...]:
    """A comma-separated list of integers of at least ``minimum`` from a flag."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or min(values) < minimum:
        raise ValueError(f"{flag} takes comma-separated integers >= {minimum}, got {text!r}")
    return values


def names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names from a flag."""
    return tuple(x.strip() for x in text.split(",") if x.strip())
