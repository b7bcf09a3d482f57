"""The security tests' own helpers (``planted``) importable by name, as ``gwtest`` is."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
