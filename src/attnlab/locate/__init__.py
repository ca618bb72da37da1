"""Where a model's files are: the bundled default, a local folder or a hub id (below both the
transformers loader and attnlab's own transformer)."""
