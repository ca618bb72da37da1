"""Figures (matplotlib) and self-contained viewer pages (static HTML/JS/CSS in ``static/``, the
maps as JSON). The server that serves them live is :mod:`attnlab.web`."""
