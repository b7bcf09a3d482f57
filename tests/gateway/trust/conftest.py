"""The trust tests' helpers (``trust_helpers``) importable by name, as ``gwtest`` is one folder up."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
