"""`attnlab ...`: the command line, one thin handler per command over library calls."""
