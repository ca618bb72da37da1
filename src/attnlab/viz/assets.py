"""The viewer's static files (HTML, CSS, JS in ``static/``), read from the installed package.

The server serves them and :mod:`attnlab.viz.page` inlines them into one self-contained file: one
list of files, one reader.
"""

from __future__ import annotations

from importlib import resources

STATIC_FILES = {  # served path -> (package file, media type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/long": ("long.html", "text/html; charset=utf-8"),
    "/viewer.css": ("viewer.css", "text/css; charset=utf-8"),
    **{f"/{n}.js": (f"{n}.js", "text/javascript; charset=utf-8") for n in ("core", "scene", "head", "model", "compare", "neuron",
                                                                                 "rollout", "generation", "app", "long")},
}


def read_static(name: str) -> str:
    """One file of the page, from the installed package."""
    return resources.files("attnlab.viz").joinpath("static", name).read_text(encoding="utf-8")
