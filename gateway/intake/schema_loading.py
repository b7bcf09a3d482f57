"""Schemas loaded from local files only: imports and includes resolved inside the allowed folders, any
other URL refused, so that neither a schema nor a document can make the gateway fetch anything."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import xmlschema
from lxml import etree

from gateway.errors import (
    clip,
)

XSD_NS = "http://www.w3.org/2001/XMLSchema"

#: Prefixes of the UBL common namespaces, used by :meth:`SchemaRegistry.check_path`
#: when no namespaces are given.
UBL_NAMESPACES: dict[str, str] = {
    "cac": "urn:oasis:names:specification:ubl:schema:xsd:CommonAggregateComponents-2",
    "cbc": "urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2",
    "ext": "urn:oasis:names:specification:ubl:schema:xsd:CommonExtensionComponents-2",
}

_XMLSCHEMA_OWN_DIR = Path(xmlschema.__file__).resolve().parent / "schemas"


# --------------------------------------------------------------------------- local-only loading


def _local_file(url: str) -> Path | None:
    """The absolute path a ``file:`` URL or absolute path names, else None."""
    if url.startswith("/"):
        return Path(url)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        return None  # a remote URL, another scheme, or a relative reference
    candidate = Path(urllib.parse.unquote(parts.path))
    return candidate if candidate.is_absolute() else None


class _AllowedDirs:
    def __init__(self, dirs: Iterable[Path]) -> None:
        self.dirs = tuple(Path(d).resolve() for d in dirs)

    def check(self, url: str) -> Path | None:
        """The resolved local path of *url* if it lies under an allowed directory."""
        path = _local_file(url)
        return None if path is None else self.check_path(path)

    def check_path(self, path: Path) -> Path | None:
        """*path* resolved (symbolic links too) if it lies under an allowed directory."""
        resolved = path.resolve()
        for d in self.dirs:
            if resolved == d or d in resolved.parents:
                return resolved
        return None


class LocalSchemaResolver(etree.Resolver):
    """An lxml resolver that serves schema files from the allowed directories only.

    Used on the parser that reads a schema document, it sees the document
    itself and every ``xs:import`` / ``xs:include`` / ``xs:redefine`` of the
    compile. A local file under an allowed directory is served; anything else
    (another directory, a relative or remote URL, any non-``file`` scheme) is
    refused by raising, which makes the compile fail; ``refused`` lists what
    was refused, for the error message.
    """

    class RefusedError(Exception):
        pass

    def __init__(self, allowed_dirs: Iterable[Path]) -> None:
        super().__init__()
        self._allowed = _AllowedDirs(allowed_dirs)
        self.refused: list[str] = []

    def resolve(self, system_url: str, public_id: str, context: Any) -> Any:
        path = self._allowed.check(system_url or "")
        if path is None:
            self.refused.append(clip(str(system_url), 200))
            raise self.RefusedError(system_url)
        return self.resolve_filename(str(path), context)


class _GuardedFileHandler(urllib.request.FileHandler):
    """The only handler of xmlschema's opener: local files under allowed directories."""

    def __init__(self, allowed: _AllowedDirs) -> None:
        super().__init__()
        self._allowed = allowed

    def file_open(self, req: urllib.request.Request) -> Any:
        if self._allowed.check(req.full_url) is None:
            raise urllib.error.URLError(f"refused: {req.full_url} is outside the allowed schema directories")
        return super().file_open(req)


def _guarded_opener(allowed: _AllowedDirs) -> urllib.request.OpenerDirector:
    opener = urllib.request.OpenerDirector()
    opener.add_handler(_GuardedFileHandler(allowed))
    opener.add_handler(urllib.request.UnknownHandler())  # any other scheme: URLError
    return opener
