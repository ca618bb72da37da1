"""The processes of a local group import their functions by name: the workers' folder goes on sys.path."""

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
