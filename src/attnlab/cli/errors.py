"""What the CLI says when a command fails: the user's mistake, or attnlab's.

**Input errors** are the user's to fix and end in one line, ``error: …``, and exit status 2:

- what the command line parser refuses (an unknown flag, a value of the wrong type or out of range:
  click's ``UsageError``), said in click's words, which name the flag;
- a ``ValueError``, ``TypeError`` or ``LookupError`` that attnlab raises on purpose, by a ``raise``
  statement in its own code, with a message that names the argument (the library's convention), in
  which the names of the command's Python arguments are replaced by the flags the user typed
  (``max_tokens`` → ``--max-tokens``);
- an ``OSError``: a file that does not exist or may not be written, a port in use, a model id the hub
  does not know.

Anything else (an exception raised inside NumPy, torch or transformers, a ``RuntimeError``, a
``KeyError`` from a lookup in attnlab's code) is an **internal error**: a bug in attnlab or in what it
runs on, not in the input. It ends in one line that says so and asks for a report, and exit status 1.
``ATTNLAB_DEBUG=1`` shows the traceback of either kind.
"""

from __future__ import annotations

import dis
import re
from pathlib import Path
from types import TracebackType

import attnlab

USAGE, INTERNAL = 2, 1  # exit statuses
PACKAGE = Path(attnlab.__file__).resolve().parent
_RAISE = dis.opmap["RAISE_VARARGS"]
REPORT = "this is a bug in attnlab, not in your input: please report it with the command you ran"


def _last_frame(tb: TracebackType | None) -> TracebackType | None:
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def raised_on_purpose(exc: BaseException) -> bool:
    """True when ``exc`` left a ``raise`` statement in attnlab's own code (not a failure inside a
    library call or a builtin that attnlab's code happened to make)."""
    tb = _last_frame(exc.__traceback__)
    if tb is None:
        return False
    code = tb.tb_frame.f_code
    inside = Path(code.co_filename).resolve().is_relative_to(PACKAGE)
    return inside and code.co_code[tb.tb_lasti] == _RAISE


def is_input_error(exc: BaseException) -> bool:
    """The user's mistake (exit 2) rather than attnlab's (exit 1); see the module's docstring."""
    if isinstance(exc, OSError):
        return True
    return isinstance(exc, (ValueError, TypeError, LookupError)) and raised_on_purpose(exc)


def click_error(exc: BaseException, name: str) -> bool:
    """``exc`` is click's exception ``name`` (``UsageError`` and its kinds, ``Abort``), from click
    itself or from the copy of click that typer >= 0.25 carries inside it."""
    return any(c.__name__ == name and c.__module__.split(".")[-1] == "exceptions" for c in type(exc).__mro__)


def in_flags(message: str, flags: dict[str, str]) -> str:
    """``message`` with the command's Python argument names written as the flags they come from: a keyword
    as Python spells it (``cache='sink'`` → ``--cache sink``, ``window=`` → ``--window``), every
    ``snake_case`` name (``deadline_ms`` → ``--deadline-ms``), and a one-word name where it is
    the subject that opens the message ("sizes must be …" → "--sizes must be …"), since a one-word
    name elsewhere is usually an English word ("this model has heads 1 to 12", "model folder …")."""
    for name, flag in flags.items():  # Python's keywords first: cache='sink' → --cache sink, window= → --window
        message = re.sub(rf"(?<![\w-]){re.escape(name)}=(?:'([^']*)'|\"([^\"]*)\"|([^\s,;:)'\"]+))?",
                         lambda m, flag=flag: " ".join([flag, *(g for g in m.groups() if g)]), message)
    for name, flag in flags.items():
        if "_" in name:
            message = re.sub(rf"(?<![\w-]){re.escape(name)}(?!\w)", flag, message)
    first = re.match(r"([a-z]\w*)(?= (?:must|is|takes|has|was|needs|cannot) )", message)
    if first and first.group(1) in flags:
        message = flags[first.group(1)] + message[first.end():]
    return message


def command_flags(group, argv: list[str]) -> dict[str, str]:  # noqa: ANN001 (a click Group)
    """Python name → flag (``max_tokens`` → ``--max-tokens``) of the options of the command that
    ``argv`` calls, or {} when it names none."""
    name = next((a for a in argv if not a.startswith("-")), None)
    command = group.commands.get(name) if name else None
    if command is None:
        return {}
    return {p.name: max(p.opts, key=len) for p in command.params
            if p.param_type_name == "option" and p.name and p.opts}


def non_utf8_argument(argv: list[str]) -> str | None:
    """The message for the first argument that is not UTF-8 text (Python hands such bytes over as
    lone surrogates, which no tokenizer takes), or None when every argument is text."""
    for i, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            try:
                shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            except UnicodeEncodeError:  # a surrogate that stands for no byte
                shown = arg.encode("utf-8", "backslashreplace").decode("utf-8")
            return (f"argument {i} ('{shown}') is not UTF-8 text; attnlab takes text in UTF-8 "
                    f"(check the terminal's or the script's encoding)")
    return None
