"""`attnlab serve`: the web viewer, offline."""

from __future__ import annotations

import typer

from attnlab.cli.common import MODEL_HELP, REVISION_HELP, err


def serve(
    model: str = typer.Option(None, "--model", help=MODEL_HELP),
    revision: str = typer.Option(None, "--revision", help=REVISION_HELP),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; the default serves this machine only."),
    port: int = typer.Option(8765, "--port", min=1, max=65535, help="Port to listen on."),
) -> None:
    """The web viewer: type one or two sentences and explore every head in the browser, offline."""
    from attnlab.lesson.scene import scene
    from attnlab.web.server import serve as run_server

    run_server(model, revision, host, port, announce=lambda line: err.print(line, highlight=False), scene=scene())
