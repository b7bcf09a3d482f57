"""Compiled rule sets cached on disk, keyed by the SHA-256 of every source file and the compiler's version."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from gateway.rules.compiled import COMPILER_VERSION, CompiledSchematron
from gateway.rules.compiler import compile_schematron
from gateway.rules.reading import _sha256
from gateway.rules.saxon import SaxonRules

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- the cache


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/b2bgw/rules`` (``~/.cache/b2bgw/rules``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "b2bgw" / "rules"


def _cache_file(cache_dir: Path, path: Path, phase: str | None) -> Path:
    key = _sha256(f"{COMPILER_VERSION}\0{path}\0{phase or ''}".encode())
    return cache_dir / f"{key[:32]}.json"


def _cached(entry: Path) -> CompiledSchematron | None:
    """The cache entry if every source file it was compiled from still has the same SHA-256."""
    try:
        compiled = CompiledSchematron.from_json(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for name, digest in compiled.files.items():
        try:
            if _sha256(Path(name).read_bytes()) != digest:
                return None
        except OSError:
            return None
    return compiled


def load_schematron(
    path: str | Path, phase: str | None = None, *, cache_dir: str | Path | None = None, check: SaxonRules | None = None
) -> CompiledSchematron:
    """:func:`compile_schematron` through the cache in *cache_dir* (None: no cache).

    A rule set is written to the cache only once Saxon has compiled its stylesheet (with *check*, or a
    :class:`SaxonRules` made for it), so an entry found there is known to compile."""
    file = Path(path).absolute()
    entry = _cache_file(Path(cache_dir), file, phase) if cache_dir is not None else None
    if entry is not None:
        found = _cached(entry)
        if found is not None:
            return found
    compiled = compile_schematron(file, phase)
    (check or SaxonRules()).check(compiled)
    if entry is not None:
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                "w", encoding="utf-8", dir=entry.parent, delete=False, prefix=".tmp-", suffix=".json"
            ) as out:
                out.write(compiled.to_json())
            os.replace(out.name, entry)
        except OSError as exc:
            log.warning("could not write the rule set cache %s: %s", entry, exc)
    return compiled
