"""Reading a rule file: local includes and XSLT modules resolved from disk, nothing fetched, each element
marked with the file and line it came from so that a compile error points at the source."""

from __future__ import annotations

import hashlib
import urllib.parse
from pathlib import Path

from lxml import etree

from gateway.errors import clip
from gateway.rules.compiled import _MAX_INCLUDE_DEPTH, _SRC, SCH_NS, XI_NS, XSL_NS, SchematronError

# --------------------------------------------------------------------------- reading rule files


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _local_path(href: str, base: Path, where: tuple[str, int | None], what: str) -> Path:
    """The local file *href* names (relative to *base*'s folder); anything else is a SchematronError."""
    parts = urllib.parse.urlsplit(href)
    if parts.scheme and len(parts.scheme) > 1:  # a one-letter scheme is a Windows drive
        if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
            raise SchematronError(
                f"{what} {clip(href, 200)!r} is not a local file; rule files may include "
                "local files only (nothing is fetched from the network)",
                file=where[0],
                line=where[1],
            )
        return Path(urllib.parse.unquote(parts.path))
    return (base.parent / urllib.parse.unquote(parts.path)).resolve()


class _Reader:
    """Reads a rule file and everything it includes, marking each element with its file and line."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.file_names: list[str] = []

    def _parse(self, path: Path, where: tuple[str, int | None] | None, what: str) -> etree._Element:
        shown = str(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            if where is None:
                raise SchematronError("no such file", file=shown) from None
            raise SchematronError(f"{what} {shown}: no such file", file=where[0], line=where[1]) from None
        except OSError as exc:
            raise SchematronError(f"cannot read it: {clip(str(exc), 200)}", file=shown) from None
        self.files[shown] = _sha256(data)
        parser = etree.XMLParser(
            resolve_entities=False,
            no_network=True,
            load_dtd=False,
            huge_tree=False,
            remove_comments=True,
            remove_pis=True,
        )
        try:
            root = etree.fromstring(data, parser, base_url=path.as_uri())
        except etree.XMLSyntaxError as exc:
            line = exc.lineno if getattr(exc, "lineno", None) else None
            raise SchematronError(
                f"not well-formed XML: {clip(exc.msg or str(exc), 200)}", file=shown, line=line
            ) from None
        if root.getroottree().docinfo.internalDTD is not None:
            raise SchematronError("rule files may not have a DOCTYPE", file=shown, line=1)
        index = len(self.file_names)
        self.file_names.append(shown)
        for el in root.iter(etree.Element):
            el.set(_SRC, f"{index}:{el.sourceline or 0}")
        return root

    def where(self, el: etree._Element) -> tuple[str, int | None]:
        mark = el.get(_SRC)
        if not mark:
            return (self.file_names[0] if self.file_names else "<rules>", None)
        index, line = mark.split(":", 1)
        return self.file_names[int(index)], (int(line) or None)

    def file_of(self, el: etree._Element) -> Path:
        return Path(self.where(el)[0])

    def read(self, path: Path) -> etree._Element:
        root = self._parse(path, None, "rule file")
        self._expand(root, path, [str(path)])
        return root

    def _expand(self, root: etree._Element, path: Path, stack: list[str]) -> None:
        """Replace every sch:include and xi:include under *root* (itself included) by what it names."""
        if len(stack) > _MAX_INCLUDE_DEPTH:
            raise SchematronError(f"includes nest deeper than {_MAX_INCLUDE_DEPTH} files", file=stack[-1])
        for el in list(root.iter(f"{{{SCH_NS}}}include", f"{{{XI_NS}}}include")):
            where = self.where(el)
            href = el.get("href")
            if not href:
                raise SchematronError("an include has no href", file=where[0], line=where[1])
            what = "sch:include" if el.tag.startswith(f"{{{SCH_NS}") else "xi:include"
            if what == "xi:include" and (el.get("xpointer") or el.get("parse", "xml") not in ("xml", "text")):
                raise SchematronError(
                    'xi:include: only parse="xml" or "text" of a whole file is supported (no xpointer)',
                    file=where[0],
                    line=where[1],
                )
            target, _, fragment = href.partition("#")
            file = _local_path(target, self.file_of(el), where, what)
            if str(file) in stack:
                raise SchematronError(
                    f"{what} {href!r} includes itself (through {' -> '.join(stack)})", file=where[0], line=where[1]
                )
            if not file.is_file():
                raise SchematronError(f"{what} {href!r}: no such file ({file})", file=where[0], line=where[1])
            parent = el.getparent()
            if what == "xi:include" and el.get("parse") == "text":
                try:
                    text = file.read_text(encoding=el.get("encoding") or "utf-8")
                except OSError as exc:
                    raise SchematronError(
                        f"{what} {href!r}: {clip(str(exc), 200)}", file=where[0], line=where[1]
                    ) from None
                self.files[str(file)] = _sha256(text.encode("utf-8"))
                _replace_with_text(el, text)
                continue
            included = self._parse(file, where, what)
            if fragment:
                hits = [e for e in included.iter(etree.Element) if e.get("id") == fragment]
                if not hits:
                    raise SchematronError(
                        f"{what} {href!r}: {file} has no element with id {fragment!r}", file=where[0], line=where[1]
                    )
                included = hits[0]
            self._expand(included, file, [*stack, str(file)])
            if parent is None:  # pragma: no cover - the root is never an include
                raise SchematronError(f"{what} cannot be the root element", file=where[0], line=where[1])
            included.tail = el.tail
            parent.replace(el, included)


def _replace_with_text(el: etree._Element, text: str) -> None:
    parent = el.getparent()
    previous = el.getprevious()
    addition = text + (el.tail or "")
    if previous is not None:
        previous.tail = (previous.tail or "") + addition
    else:
        parent.text = (parent.text or "") + addition
    parent.remove(el)


def _xslt_module_files(
    href: str, base: Path, files: dict[str, str], where: tuple[str, int | None], depth: int = 0
) -> Path:
    """Record an ``xsl:include`` / ``xsl:import`` module and the modules it includes (cache key)."""
    path = _local_path(href, base, where, "xsl:include/xsl:import")
    if str(path) in files or depth > _MAX_INCLUDE_DEPTH:
        return path
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SchematronError(
            f"xsl:include/xsl:import {href!r}: {clip(exc.strerror or str(exc), 200)} ({path})",
            file=where[0],
            line=where[1],
        ) from None
    files[str(path)] = _sha256(data)
    try:
        module = etree.fromstring(data, etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False))
    except etree.XMLSyntaxError as exc:
        raise SchematronError(
            f"not well-formed XML: {clip(exc.msg or str(exc), 200)}", file=str(path), line=getattr(exc, "lineno", None)
        ) from None
    for inc in module.iter(f"{{{XSL_NS}}}include", f"{{{XSL_NS}}}import"):
        if inc.get("href"):
            _xslt_module_files(inc.get("href"), path, files, (str(path), inc.sourceline), depth + 1)
    return path
