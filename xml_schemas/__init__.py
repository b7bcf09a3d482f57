"""Vendored XML schemas, shipped as package data.

``ubl-2.1/`` is the OASIS UBL 2.1 runtime schema set (``xsdrt``), copied
unchanged: ``maindoc/`` holds one schema per document type, ``common/`` the
components they import by relative path (``../common/...``). Code finds the
files through :func:`schema_path` or :data:`UBL_21_DIR`, never through the
current directory, so they work from an installed wheel as well as from a
checkout.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SCHEMAS_DIR", "UBL_21_DIR", "schema_path"]

#: The folder of this package: the root of every vendored schema tree.
SCHEMAS_DIR: Path = Path(__file__).resolve().parent

#: The UBL 2.1 runtime schemas (``maindoc/`` and ``common/``).
UBL_21_DIR: Path = SCHEMAS_DIR / "ubl-2.1"


def schema_path(*parts: str) -> Path:
    """Return the absolute path of a vendored schema file or folder.

    ``schema_path("ubl-2.1", "maindoc", "UBL-Order-2.1.xsd")``. The parts are
    joined below :data:`SCHEMAS_DIR`; a path that would leave it (``..``, an
    absolute part) raises ``ValueError``, and one that does not exist raises
    ``FileNotFoundError`` naming it.
    """
    path = SCHEMAS_DIR.joinpath(*parts).resolve()
    if path != SCHEMAS_DIR and SCHEMAS_DIR not in path.parents:
        raise ValueError(f"schema path {'/'.join(parts)!r} leaves {SCHEMAS_DIR}")
    if not path.exists():
        raise FileNotFoundError(f"no vendored schema at {path}")
    return path
