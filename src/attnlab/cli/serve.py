"""`attnlab serve`: the web viewer, offline."""

from __future__ import annotations

import typer

from attnlab.cli.common import err, model_option, revision_option


def serve(
    model: str = model_option(),
    revision: str = revision_option(),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; the default serves this machine only."),
    port: int = typer.Option(8765, "--port", min=1, max=65535, help="Port to listen on."),
) -> None:
    """The web viewer: type one or two sentences and explore every head in the browser, offline."""
    from attnlab.lesson.scene import scene
    from attnlab.web.server import serve as run_server

    run_server(model, revision, host, port, announce=lambda line: err.print(line, highlight=False), scene=scene())
