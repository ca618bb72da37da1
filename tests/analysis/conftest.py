"""Tiny random models for the analysis tests: the builders of tests/models/conftest.py (loaded by
path, since test folders are not packages)."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_tiny_models", Path(__file__).parent.parent / "models" / "conftest.py")
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """A tiny Llama-style decoder (2 layers × 4 heads, RoPE, grouped-query attention) in a folder."""
    folder = tmp_path_factory.mktemp("tiny-llama-analysis")
    tiny.build("llama", folder)
    return folder
