"""Figures (matplotlib) and the web viewer (static assets + a local server)."""
