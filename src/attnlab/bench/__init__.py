"""The measuring harness: time and memory of attention as the context grows (`attnlab bench`, the lesson's cost section)."""
