"""How maps show themselves in a notebook: the maps types ask a renderer registered from above.

The viewer draws maps, so the maps data may not import it. ``attnlab/__init__.py`` registers the
viewer's notebook frame here at import; until something registers one, maps have no HTML form and
a notebook shows their ``repr``.
"""

from __future__ import annotations

from typing import Callable

# The maps types import this module, so it names them only in words: ``maps`` is any maps object
# (attnlab.maps.records.Maps).
_html: Callable[[object], str] | None = None


def register_html(render: Callable[[object], str]) -> None:
    """Make ``render(maps) -> str`` the HTML form of every maps object (token or word level)."""
    global _html
    _html = render


def html(maps: object) -> str | None:
    """The registered HTML form of ``maps``, or None when nothing is registered."""
    return None if _html is None else _html(maps)
