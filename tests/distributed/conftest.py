"""The processes of a local group import their functions by name: the workers' folder goes on sys.path.

A test that starts a group says so with ``@pytest.mark.gloo`` (on its module): where torch has no
gloo backend it is skipped with that reason (torch itself: the ``needs("torch")`` mark)."""

import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


def _gloo_missing() -> str | None:
    try:
        import torch.distributed as dist
    except ImportError:  # no torch: the needs mark says what to install
        return None
    if not dist.is_available() or not dist.is_gloo_available():
        return "torch.distributed with gloo is not available"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "gloo: starts a group of local processes (torch.distributed with gloo)")


def pytest_runtest_setup(item):
    if item.get_closest_marker("gloo") is not None:
        why = _gloo_missing()
        if why:
            pytest.skip(why)
