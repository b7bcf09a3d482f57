"""ISO Schematron (ISO/IEC 19757-3) compiled to XSLT 3.0 and run by SaxonC-HE, in-process.

lxml's ``isoschematron`` runs XSLT 1.0 only, while published e-procurement rule sets (Peppol BIS 3, EN 16931)
declare ``queryBinding="xslt2"`` and use ``xsl:function``, ``xsl:key``, abstract patterns and ``let``; no
maintained Python package compiles those, so this module is the compiler, kept small.

:func:`compile_schematron` reads a rule file (local includes resolved, nothing fetched), expands abstract
patterns and rules, selects the phase, and writes one XSLT 3.0 stylesheet: each rule of an active pattern is
an ``xsl:for-each`` over the nodes its context matches, less those an earlier rule of the pattern took (left
out where the two contexts cannot share a node, the common case): selecting beats a template walk per
pattern. Lets become global or local variables, the schema's ``xsl:`` declarations are copied through, and
the output is one text record per failed assertion or successful report (a passing document produces
nothing). ``queryBinding`` ``xslt`` runs in XSLT 1.0 backwards-compatible mode; ``xslt2`` and ``xslt3`` as
written. :func:`load_schematron` caches the result on disk, keyed by the SHA-256 of every source file.

:class:`SaxonRules` runs compiled rule sets on untrusted documents: the parser refuses any DOCTYPE, and once
the rule sets are compiled every URI access (``doc()``, ``unparsed-text()``...) is refused, so that no
document can make the rules read a file or the network (``doc()`` of a literal URI is evaluated when the
stylesheet compiles). A rule file that cannot be used raises :class:`SchematronError` (a
:class:`~gateway.errors.ConfigError`) with the ``file:line`` of the problem.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lxml import etree

from gateway.errors import ConfigError, clip
from gateway.xpaths import without_predicates

__all__ = [
    "Assertion",
    "CompiledSchematron",
    "Finding",
    "SaxonRules",
    "SchematronError",
    "compile_schematron",
    "document_text",
    "document_utf8",
    "load_schematron",
    "locate",
    "parse_output",
    "severity_of",
]

log = logging.getLogger(__name__)

SCH_NS = "http://purl.oclc.org/dsdl/schematron"
XSL_NS = "http://www.w3.org/1999/XSL/Transform"
XI_NS = "http://www.w3.org/2001/XInclude"
OLD_SCH_NS = "http://www.ascc.net/xml/schematron"
#: The namespace of the generated stylesheet's own modes, functions and variables (EQNames, no prefix).
OWN_NS = "urn:b2bgw:schematron"
#: Marks each generated XSLT element with the rule file and line it comes from (for error messages).
_SRC_NS = "urn:b2bgw:schematron:source"
_SRC = f"{{{_SRC_NS}}}at"
#: The mode the generated stylesheet starts in (from the document node).
MAIN_MODE = f"Q{{{OWN_NS}}}main"

#: Changes whenever the generated stylesheets change: part of the cache key.
COMPILER_VERSION = "1"

QUERY_BINDINGS = ("xslt", "xslt2", "xslt3")

# Record, field and list separators of the stylesheet's text output: private-use characters, which no XML
# name can hold; document text that holds them has them removed before it is output.
_RS, _FS, _LS = "\ue000", "\ue001", "\ue002"
_EQNAME_URI = re.compile(r"Q\{([^}]*)\}")
_PATH_STEP = re.compile(r"/(?:Q\{([^}]*)\}([^/\[]+)\[(\d+)\]|(@|text\(\)|comment\(\)|processing-instruction\()[^/]*)")

_WARNING_FLAGS = {"warning", "warn"}
_INFO_FLAGS = {"information", "info"}

_MAX_INCLUDE_DEPTH = 32
_NAME = re.compile(r"^[A-Za-z_][\w.\-]*(?::[A-Za-z_][\w.\-]*)?$")
_VARIABLE_REF = re.compile(r"\$([A-Za-z_][\w.\-]*(?::[A-Za-z_][\w.\-]*)?)")
# Contexts that can match nodes other than elements and the document node.
_ATTRIBUTE_CONTEXT = re.compile(r"@|attribute\s*(?:::|\()")
_OTHER_NODE_CONTEXT = re.compile(r"\b(?:text|node|comment|processing-instruction|namespace-node)\s*\(|\$|^\s*\.")


class SchematronError(ConfigError):
    """Raised when a rule file cannot be used: not ISO Schematron, an XML syntax error, an include that
    is missing or not a local file, an unknown phase, pattern, abstract rule or diagnostic, or an XPath
    (or copied XSLT) that does not compile. ``file`` and ``line`` point at the problem; ``errors`` lists
    every problem found when there are several (XPath errors are all reported at once)."""

    code = "config-error"

    def __init__(self, detail: str | None = None, *, file: str | None = None, line: int | None = None,
                 errors: list[SchematronError] | None = None) -> None:
        super().__init__(detail, file=file, line=line)
        self.errors: list[SchematronError] = errors if errors else [self]


def severity_of(flag: str | None) -> str:
    """``error``, ``warning`` or ``information`` for an assertion's flag (no flag, ``fatal``, ``error`` and
    any other flag fail a document)."""
    if flag is None:
        return "error"
    word = flag.strip().lower()
    if word in _WARNING_FLAGS:
        return "warning"
    if word in _INFO_FLAGS:
        return "information"
    return "error"


@dataclass(frozen=True)
class Assertion:
    """One ``sch:assert`` or ``sch:report`` of a compiled rule set."""

    index: int
    kind: str  # "assert" or "report"
    id: str | None
    flag: str | None
    role: str | None
    see: str | None
    pattern: str | None
    test: str
    file: str
    line: int | None

    @property
    def severity(self) -> str:
        """What a finding of it does: an unflagged report only informs; every other finding by its flag."""
        if self.kind == "report" and self.flag is None:
            return "information"
        return severity_of(self.flag)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "id": self.id, "flag": self.flag, "role": self.role,
                "see": self.see, "pattern": self.pattern, "test": self.test, "file": self.file, "line": self.line}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Assertion:
        return cls(**data)


@dataclass(frozen=True)
class Finding:
    """A failed assertion or a successful report on one document."""

    assertion: Assertion
    location: str
    text: str
    diagnostics: tuple[str, ...] = ()
    #: the node's ``fn:path()`` (``/Q{ns}Order[1]/Q{ns}OrderLine[2]``): :func:`locate` finds it in a tree
    path: str = ""

    @property
    def failed_assert(self) -> bool:
        return self.assertion.kind == "assert"

    @property
    def is_error(self) -> bool:
        """Whether this finding refuses the document."""
        return self.assertion.severity == "error"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.assertion.id, "flag": self.assertion.flag, "location": self.location,
                               "text": self.text}
        if self.diagnostics:
            out["diagnostics"] = list(self.diagnostics)
        return out


@dataclass
class CompiledSchematron:
    """A rule file compiled to XSLT 3.0, with the table of its assertions (by record number)."""

    path: str
    phase: str | None
    query_binding: str
    title: str | None
    xslt: str
    assertions: list[Assertion]
    #: every source file read (the rule file, its includes, copied XSLT modules): path -> SHA-256
    files: dict[str, str]
    #: generated stylesheet line -> (rule file, line), for Saxon's error messages
    line_map: dict[int, tuple[str, int]] = field(default_factory=dict)
    #: the rule set's prefixes (``sch:ns``), which locations are written with
    namespaces: dict[str, str] = field(default_factory=dict)
    from_cache: bool = False
    _shown: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def display_path(self, path: str) -> str:
        """*path* (``fn:path()``: ``Q{uri}name[n]`` steps) with the rule set's prefixes where it has one."""
        if "Q{" not in path:
            return path
        shown = self._shown.get(path)
        if shown is None:
            if len(self._shown) >= 4096:  # the same few paths come back document after document
                self._shown.clear()
            shown = self._shown[path] = self._display(path)
        return shown

    def _display(self, path: str) -> str:
        prefixes = getattr(self, "_prefixes", None)
        if prefixes is None:
            prefixes = {}
            for prefix, uri in self.namespaces.items():
                prefixes.setdefault(uri, prefix)
            self._prefixes = prefixes

        def name(m: re.Match[str]) -> str:
            uri = m.group(1)
            if not uri:
                return ""
            prefix = prefixes.get(uri)
            return f"{prefix}:" if prefix else m.group(0)

        return _EQNAME_URI.sub(name, path)

    def to_json(self) -> str:
        return json.dumps({
            "version": COMPILER_VERSION, "path": self.path, "phase": self.phase, "query_binding": self.query_binding,
            "title": self.title, "xslt": self.xslt, "assertions": [a.to_dict() for a in self.assertions],
            "files": self.files, "line_map": {str(k): list(v) for k, v in self.line_map.items()},
            "namespaces": self.namespaces,
        })

    @classmethod
    def from_json(cls, text: str) -> CompiledSchematron:
        data = json.loads(text)
        if data.get("version") != COMPILER_VERSION:
            raise ValueError("compiled by another version")
        return cls(path=data["path"], phase=data["phase"], query_binding=data["query_binding"], title=data["title"],
                   xslt=data["xslt"], assertions=[Assertion.from_dict(a) for a in data["assertions"]],
                   files=data["files"], line_map={int(k): (v[0], v[1]) for k, v in data["line_map"].items()},
                   namespaces=data["namespaces"], from_cache=True)


# --------------------------------------------------------------------------- reading rule files


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _local_path(href: str, base: Path, where: tuple[str, int | None], what: str) -> Path:
    """The local file *href* names (relative to *base*'s folder); anything else is a SchematronError."""
    parts = urllib.parse.urlsplit(href)
    if parts.scheme and len(parts.scheme) > 1:  # a one-letter scheme is a Windows drive
        if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
            raise SchematronError(f"{what} {clip(href, 200)!r} is not a local file; rule files may include "
                                  "local files only (nothing is fetched from the network)", file=where[0],
                                  line=where[1])
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
        parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False,
                                 remove_comments=True, remove_pis=True)
        try:
            root = etree.fromstring(data, parser, base_url=path.as_uri())
        except etree.XMLSyntaxError as exc:
            line = exc.lineno if getattr(exc, "lineno", None) else None
            raise SchematronError(f"not well-formed XML: {clip(exc.msg or str(exc), 200)}", file=shown,
                                  line=line) from None
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
                raise SchematronError("xi:include: only parse=\"xml\" or \"text\" of a whole file is supported "
                                      "(no xpointer)", file=where[0], line=where[1])
            target, _, fragment = href.partition("#")
            file = _local_path(target, self.file_of(el), where, what)
            if str(file) in stack:
                raise SchematronError(f"{what} {href!r} includes itself (through {' -> '.join(stack)})",
                                      file=where[0], line=where[1])
            if not file.is_file():
                raise SchematronError(f"{what} {href!r}: no such file ({file})", file=where[0], line=where[1])
            parent = el.getparent()
            if what == "xi:include" and el.get("parse") == "text":
                try:
                    text = file.read_text(encoding=el.get("encoding") or "utf-8")
                except OSError as exc:
                    raise SchematronError(f"{what} {href!r}: {clip(str(exc), 200)}", file=where[0],
                                          line=where[1]) from None
                self.files[str(file)] = _sha256(text.encode("utf-8"))
                _replace_with_text(el, text)
                continue
            included = self._parse(file, where, what)
            if fragment:
                hits = [e for e in included.iter(etree.Element) if e.get("id") == fragment]
                if not hits:
                    raise SchematronError(f"{what} {href!r}: {file} has no element with id {fragment!r}",
                                          file=where[0], line=where[1])
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


def _xslt_module_files(href: str, base: Path, files: dict[str, str], where: tuple[str, int | None],
                       depth: int = 0) -> Path:
    """Record an ``xsl:include`` / ``xsl:import`` module and the modules it includes (cache key)."""
    path = _local_path(href, base, where, "xsl:include/xsl:import")
    if str(path) in files or depth > _MAX_INCLUDE_DEPTH:
        return path
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SchematronError(f"xsl:include/xsl:import {href!r}: {clip(exc.strerror or str(exc), 200)} ({path})",
                              file=where[0], line=where[1]) from None
    files[str(path)] = _sha256(data)
    try:
        module = etree.fromstring(data, etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False))
    except etree.XMLSyntaxError as exc:
        raise SchematronError(f"not well-formed XML: {clip(exc.msg or str(exc), 200)}", file=str(path),
                              line=getattr(exc, "lineno", None)) from None
    for inc in module.iter(f"{{{XSL_NS}}}include", f"{{{XSL_NS}}}import"):
        if inc.get("href"):
            _xslt_module_files(inc.get("href"), path, files, (str(path), inc.sourceline), depth + 1)
    return path


# --------------------------------------------------------------------------- compiling


def _sch(name: str) -> str:
    return f"{{{SCH_NS}}}{name}"


def _xsl(name: str) -> str:
    return f"{{{XSL_NS}}}{name}"


def _substitute(text: str, values: dict[str, str]) -> str:
    """Replace ``$name`` by its value (abstract pattern parameters, renamed lets), whole names only."""
    if "$" not in text or not values:
        return text
    return _VARIABLE_REF.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def _substitute_tree(el: etree._Element, values: dict[str, str], *, skip: tuple[str, ...] = ()) -> None:
    for node in el.iter(etree.Element):
        for name, value in node.attrib.items():
            if name in skip or name == _SRC or "$" not in value:
                continue
            node.set(name, _substitute(value, values))


@dataclass
class _Rule:
    element: etree._Element
    context: str
    children: list[etree._Element]


@dataclass
class _Pattern:
    element: etree._Element
    id: str | None
    rules: list[_Rule]
    group: bool = False


class _Compiler:
    def __init__(self, reader: _Reader, root: etree._Element, phase: str | None) -> None:
        self.reader = reader
        self.root = root
        self.phase_asked = phase
        self.assertions: list[Assertion] = []
        self.static_lets: list[etree._Element] = []

    def error(self, el: etree._Element, message: str) -> SchematronError:
        file, line = self.reader.where(el)
        return SchematronError(message, file=file, line=line)

    def required(self, el: etree._Element, attribute: str) -> str:
        value = el.get(attribute)
        if value is None or not value.strip():
            raise self.error(el, f"sch:{etree.QName(el).localname} needs a {attribute!r} attribute")
        return value

    # ----------------------------------------------------------------- the schema

    def compile(self) -> tuple[etree._Element, str, str | None, str | None]:
        root = self.root
        if root.tag == f"{{{OLD_SCH_NS}}}schema":
            raise self.error(root, "this is Schematron 1.5 (namespace http://www.ascc.net/xml/schematron); "
                                   f"ISO Schematron uses {SCH_NS}")
        if root.tag != _sch("schema"):
            raise self.error(root, f"not an ISO Schematron schema: the root element is {root.tag!r}, "
                                   f"expected schema in {SCH_NS}")
        binding = (root.get("queryBinding") or "xslt").strip().lower()
        if binding not in QUERY_BINDINGS:
            raise self.error(root, f"queryBinding {binding!r} is not supported (use one of "
                                   f"{', '.join(QUERY_BINDINGS)})")
        title_el = root.find(_sch("title"))
        title = " ".join("".join(title_el.itertext()).split()) if title_el is not None else None

        # the prefixes declared anywhere in the rule file (copied XSLT may use them in XPaths), then sch:ns
        namespaces: dict[str, str] = {}
        for el in root.iter(etree.Element):
            for p, u in el.nsmap.items():
                if p and p != "xsl" and u != _SRC_NS:
                    namespaces.setdefault(p, u)
        for ns in root.iter(_sch("ns")):
            prefix, uri = self.required(ns, "prefix"), ns.get("uri")
            if uri is None:
                raise self.error(ns, "sch:ns needs a 'uri' attribute")
            if prefix == "xsl" and uri != XSL_NS:
                raise self.error(ns, "the prefix 'xsl' is reserved for the XSLT namespace")
            namespaces[prefix] = uri
        namespaces.pop(None, None)  # type: ignore[call-overload]

        self.diagnostics = {d.get("id"): d for d in root.iter(_sch("diagnostic")) if d.get("id")}
        self.abstract_rules = {r.get("id"): r for r in root.iter(_sch("rule")) if r.get("abstract") == "true"}
        for rid, rule in self.abstract_rules.items():
            if rid is None:
                raise self.error(rule, "an abstract rule needs an 'id'")
        self.abstract_patterns = {p.get("id"): p for p in root.iter(_sch("pattern")) if p.get("abstract") == "true"}

        patterns = self._patterns()
        phase_id, phase_el, active = self._phase(patterns)

        nsmap = {"xsl": XSL_NS, **{p: u for p, u in namespaces.items() if p != "xsl"}}
        sheet = etree.Element(_xsl("stylesheet"), nsmap=nsmap)
        sheet.set("version", "3.0")
        sheet.set("exclude-result-prefixes", "#all")

        foreign = [el for el in root if isinstance(el.tag, str) and el.tag.startswith(f"{{{XSL_NS}}}")]
        for pattern in active:
            foreign += [el for el in pattern.element
                        if isinstance(el.tag, str) and el.tag.startswith(f"{{{XSL_NS}}}")]
        if phase_el is not None:
            foreign += [el for el in phase_el if isinstance(el.tag, str) and el.tag.startswith(f"{{{XSL_NS}}}")]
        for el in sorted(foreign, key=lambda e: etree.QName(e).localname != "import"):  # imports come first
            sheet.append(self._foreign(el))

        out = etree.SubElement(sheet, _xsl("output"))
        out.set("method", "text")
        out.set("encoding", "UTF-8")

        # global lets: schema, phase, then each active pattern's (renamed where the name is taken)
        taken: dict[str, etree._Element] = {}
        for let in [el for el in root if el.tag == _sch("let")]:
            self._global_let(sheet, let, taken, {})
        if phase_el is not None:
            for let in [el for el in phase_el if el.tag == _sch("let")]:
                self._global_let(sheet, let, taken, {})
        renames: list[dict[str, str]] = []
        for number, pattern in enumerate(active, 1):
            renamed: dict[str, str] = {}
            for let in [el for el in pattern.element if el.tag == _sch("let")]:
                self._global_let(sheet, let, taken, renamed, f"p{number}")
            renames.append(renamed)

        # static variables are in scope after their declaration only: put them before everything but imports
        position = sum(1 for el in sheet if el.tag == _xsl("import"))
        for var in reversed(self.static_lets):
            sheet.insert(position, var)
        for el in self.root.iter(etree.Element):  # files a doc() of a literal URI reads (part of the cache key)
            for value in el.attrib.values():
                for m in _LITERAL_RESOURCE.finditer(value):
                    _resource_file(m.group(2), Path(self.reader.file_names[0]), self.reader.files)
        self.namespaces = namespaces
        main = etree.SubElement(sheet, _xsl("template"))
        main.set("match", "/")
        main.set("mode", MAIN_MODE)
        for number, (pattern, renamed) in enumerate(zip(active, renames), 1):
            self._pattern(main, number, pattern, renamed, binding)
        return sheet, binding, title, phase_id

    def _foreign(self, el: etree._Element) -> etree._Element:
        """A copy of an ``xsl:`` declaration, include and import hrefs made absolute and checked local."""
        name = etree.QName(el).localname
        if name in ("output", "result-document", "import-schema"):
            raise self.error(el, f"xsl:{name} is not allowed in a rule set")
        for bad in el.iter(_xsl("result-document")):
            raise self.error(bad, "xsl:result-document is not allowed in a rule set")
        copied = copy.deepcopy(el)
        for node, original in zip(copied.iter(etree.Element), el.iter(etree.Element)):
            if not node.tag.startswith(f"{{{XSL_NS}}}"):
                node.attrib.pop(_SRC, None)
        if name in ("include", "import"):
            href = self.required(el, "href")
            path = _xslt_module_files(href, self.reader.file_of(el), self.reader.files, self.reader.where(el))
            copied.set("href", path.as_uri())
        return copied

    def _global_let(self, sheet: etree._Element, let: etree._Element, taken: dict[str, etree._Element],
                    renamed: dict[str, str], scope: str | None = None) -> None:
        name = self.required(let, "name")
        if not _NAME.match(name):
            raise self.error(let, f"let name {name!r} is not a valid variable name")
        target = name
        if name in taken:
            if scope is None:
                first = self.reader.where(taken[name])
                raise self.error(let, f"let ${name} is declared twice (first at {first[0]}:{first[1]})")
            target = f"Q{{{OWN_NS}}}{scope}.{name.replace(':', '.')}"
            renamed[name] = f"$Q{{{OWN_NS}}}{scope}.{name.replace(':', '.')}"
        else:
            taken[name] = let
        var = etree.Element(_xsl("variable"))
        var.set("name", target)
        self._let_body(var, let, renamed)
        if var.get("select") is not None and _is_constant(var.get("select")):
            # the same value for every document: computed once, when the stylesheet compiles
            var.set("static", "yes")
            self.static_lets.append(var)
        else:
            sheet.append(var)

    def _let_body(self, var: etree._Element, let: etree._Element, renamed: dict[str, str]) -> None:
        var.set(_SRC, let.get(_SRC, ""))
        if let.get("as"):
            var.set("as", let.get("as"))
        value = let.get("value")
        if value is not None:
            var.set("select", _substitute(value, renamed))
        else:
            if len(let) == 0 and not (let.text or "").strip():
                raise self.error(let, "sch:let needs a 'value' attribute or content")
            var.text = let.text
            for child in let:
                var.append(copy.deepcopy(child))

    # ----------------------------------------------------------------- patterns and phases

    def _patterns(self) -> list[_Pattern]:
        out = []
        for el in self.root.iter(_sch("pattern"), _sch("group")):
            if el.get("abstract") == "true":
                continue
            if el.get("documents"):
                raise self.error(el, "pattern/@documents (subordinate documents) is not supported: rules may "
                                     "not load other documents")
            is_a = el.get("is-a")
            source = el
            if is_a:
                abstract = self.abstract_patterns.get(is_a)
                if abstract is None:
                    raise self.error(el, f"is-a {is_a!r}: no abstract pattern has this id")
                params: dict[str, str] = {}
                for param in el.iter(_sch("param")):
                    params[self.required(param, "name")] = param.get("value", "")
                source = copy.deepcopy(abstract)
                _substitute_tree(source, params, skip=("id", "is-a", "abstract"))
                for k, v in el.attrib.items():  # the instance's own id, role, see...
                    if k not in ("is-a",):
                        source.set(k, v)
                source.attrib.pop("abstract", None)
                # the instance's own lets and foreign declarations come too
                for child in el:
                    if child.tag != _sch("param") and isinstance(child.tag, str):
                        source.append(copy.deepcopy(child))
            rules = []
            for rule in source.iter(_sch("rule")):
                if rule.get("abstract") == "true":
                    continue
                context = self.required(rule, "context")
                rules.append(_Rule(rule, context, self._rule_children(rule, [])))
            out.append(_Pattern(source, el.get("id"), rules, group=el.tag == _sch("group")))
        return out

    def _rule_children(self, rule: etree._Element, seen: list[str]) -> list[etree._Element]:
        """The lets, asserts and reports of a rule, abstract rules it extends expanded in place."""
        children: list[etree._Element] = []
        for child in rule:
            if not isinstance(child.tag, str):
                continue
            if child.tag == _sch("extends"):
                rid = child.get("rule")
                if not rid:
                    raise self.error(child, "sch:extends needs a 'rule' attribute (extends/@href is not supported)")
                target = self.abstract_rules.get(rid)
                if target is None:
                    raise self.error(child, f"sch:extends {rid!r}: no abstract rule has this id")
                if rid in seen:
                    raise self.error(child, f"sch:extends {rid!r} extends itself")
                children.extend(self._rule_children(target, [*seen, rid]))
            elif child.tag in (_sch("let"), _sch("assert"), _sch("report")) or (
                    child.tag.startswith(f"{{{XSL_NS}}}")):
                children.append(child)
        return children

    def _phase(self, patterns: list[_Pattern]) -> tuple[str | None, etree._Element | None, list[_Pattern]]:
        phases = {p.get("id"): p for p in self.root.iter(_sch("phase"))}
        asked = self.phase_asked
        default = self.root.get("defaultPhase")
        phase = asked or default or "#ALL"
        if phase == "#DEFAULT":
            phase = default or "#ALL"
        if phase == "#ALL":
            return None, None, patterns
        phase_el = phases.get(phase)
        if phase_el is None:
            known = ", ".join(sorted(p for p in phases if p)) or "none"
            where = self.root if asked else self.root
            raise self.error(where, f"phase {phase!r} is not defined (phases: {known}, or #ALL)")
        ids = {p.id for p in patterns if p.id}
        wanted = []
        for active in phase_el.iter(_sch("active")):
            pid = self.required(active, "pattern")
            if pid not in ids:
                raise self.error(active, f"phase {phase!r}: no pattern has the id {pid!r}")
            wanted.append(pid)
        return phase, phase_el, [p for p in patterns if p.id in wanted]

    # ----------------------------------------------------------------- rules

    def _pattern(self, main: etree._Element, number: int, pattern: _Pattern, renamed: dict[str, str],
                 binding: str) -> None:
        """Each rule of the pattern as an ``xsl:for-each`` over the nodes its context matches, less those an
        earlier rule of the pattern took (only where the two contexts may match the same node)."""
        taken: list[tuple[str, list[_Shape] | None]] = []  # (variable, context shapes) of rules kept in variables
        for k, rule in enumerate(pattern.rules, 1):
            context = _substitute(rule.context, renamed)
            select = _context_select(context)
            tests = _shapes(context, self.namespaces)
            earlier = [] if pattern.group else [var for var, other in taken if _may_overlap(tests, other)]
            later_overlap = not pattern.group and any(
                _may_overlap(tests, _shapes(_substitute(r.context, renamed), self.namespaces))
                for r in pattern.rules[k:])
            variable = f"Q{{{OWN_NS}}}p{number}.r{k}"
            nodes = f"({select}) except ({' | '.join('$' + v for v in earlier)})" if earlier else select
            if later_overlap:  # a later rule excludes these nodes: select them once
                var = etree.SubElement(main, _xsl("variable"))
                var.set("name", variable)
                var.set("select", nodes)
                var.set(_SRC, rule.element.get(_SRC, ""))
                nodes = "$" + variable
                taken.append((variable, tests))
            each = etree.SubElement(main, _xsl("for-each"))
            each.set("select", nodes)
            each.set(_SRC, rule.element.get(_SRC, ""))
            if binding == "xslt":
                each.set("version", "1.0")  # XPath 1.0 semantics: backwards-compatible mode
            for child in rule.children:
                self._rule_child(each, child, rule, pattern, renamed, binding)

    def _rule_child(self, body: etree._Element, child: etree._Element, rule: _Rule, pattern: _Pattern,
                    renamed: dict[str, str], binding: str) -> None:
        if child.tag == _sch("let"):
            name = self.required(child, "name")
            var = etree.SubElement(body, _xsl("variable"))
            var.set("name", name)
            self._let_body(var, child, renamed)
            return
        if child.tag.startswith(f"{{{XSL_NS}}}"):
            body.append(self._foreign(child))
            return
        kind = etree.QName(child).localname
        test = _substitute(self.required(child, "test"), renamed)
        file, line = self.reader.where(child)
        rule_el = rule.element
        assertion = Assertion(
            index=len(self.assertions), kind=kind, id=child.get("id"),
            flag=child.get("flag") or rule_el.get("flag"),
            role=child.get("role") or rule_el.get("role"),
            see=child.get("see") or rule_el.get("see") or pattern.element.get("see"),
            pattern=pattern.id, test=test, file=file, line=line,
        )
        self.assertions.append(assertion)
        check = etree.SubElement(body, _xsl("if"))
        check.set("test", f"not(({test}))" if kind == "assert" else test)
        check.set(_SRC, child.get(_SRC, ""))
        subject = child.get("subject") or rule_el.get("subject")
        node = f"((({_substitute(subject, renamed)}), .)[1])" if subject else "."
        parts = [f"'{_RS}{assertion.index}{_FS}'", f"path({node})", f"'{_FS}'"]
        messages = [child]
        refs = (child.get("diagnostics") or "").split()
        for ref in refs:
            diagnostic = self.diagnostics.get(ref)
            if diagnostic is None:
                raise self.error(child, f"diagnostics: no sch:diagnostic has the id {ref!r}")
            messages.append(diagnostic)
        out = etree.SubElement(check, _xsl("value-of"))
        out.set(_SRC, child.get(_SRC, ""))
        for i, source in enumerate(messages):
            if i:
                parts.append(f"'{_FS}'" if i == 1 else f"'{_LS}'")
            expression = self._message(source, renamed, binding)
            if expression is None:  # the message holds XSLT instructions: built as a text node
                check.remove(out)
                self._message_instructions(check, parts, messages, renamed)
                return
            parts.append(f"translate({expression}, '{_RS}{_FS}{_LS}', '')")
        out.set("select", " || ".join(parts))

    def _message(self, source: etree._Element, renamed: dict[str, str], binding: str) -> str | None:
        """An XPath string expression for the text of an assertion or diagnostic, or None when it holds XSLT
        instructions (then :meth:`_message_instructions`)."""
        pieces: list[str] = []

        def literal(value: str | None) -> None:
            if value:
                pieces.append("'" + value.replace("'", "''") + "'")

        def walk(el: etree._Element) -> bool:
            literal(el.text)
            for child in el:
                if not isinstance(child.tag, str):
                    literal(child.tail)
                    continue
                if child.tag.startswith(f"{{{XSL_NS}}}"):
                    return False
                if child.tag == _sch("value-of"):
                    select = _substitute(self.required(child, "select"), renamed)
                    if binding == "xslt":
                        pieces.append(f"string(({select}))")
                    else:
                        var = f"$Q{{{OWN_NS}}}v"
                        pieces.append(f"string-join(for {var} in ({select}) return string({var}), ' ')")
                elif child.tag == _sch("name"):
                    path = child.get("path")
                    pieces.append(f"name(({_substitute(path, renamed)})[1])" if path else "name()")
                elif not walk(child):  # sch:emph, sch:dir, sch:span, foreign markup: their text
                    return False
                literal(child.tail)
            return True

        if not walk(source):
            return None
        if not pieces:
            return "''"
        return f"string-join(({', '.join(pieces)}), '')"

    def _message_instructions(self, check: etree._Element, parts: list[str], messages: list[etree._Element],
                              renamed: dict[str, str]) -> None:
        """The slow road for a message that holds XSLT instructions: each text into a variable first."""
        head = etree.SubElement(check, _xsl("value-of"))
        head.set("select", " || ".join(parts[:3]))
        for i, source in enumerate(messages):
            if i:
                sep = etree.SubElement(check, _xsl("text"))
                sep.text = _FS if i == 1 else _LS
            var = etree.SubElement(check, _xsl("variable"))
            var.set("name", f"Q{{{OWN_NS}}}m{i}")
            self._content(var, source, renamed)
            out = etree.SubElement(check, _xsl("value-of"))
            out.set("select", f"translate($Q{{{OWN_NS}}}m{i}, '{_RS}{_FS}{_LS}', '')")

    def _content(self, target: etree._Element, source: etree._Element, renamed: dict[str, str]) -> None:
        def text(value: str | None) -> None:
            if value:
                t = etree.SubElement(target, _xsl("text"))
                t.text = value

        text(source.text)
        for child in source:
            if not isinstance(child.tag, str):
                text(child.tail)
                continue
            if child.tag == _sch("value-of"):
                v = etree.SubElement(target, _xsl("value-of"))
                v.set("select", _substitute(self.required(child, "select"), renamed))
                v.set(_SRC, child.get(_SRC, ""))
            elif child.tag == _sch("name"):
                v = etree.SubElement(target, _xsl("value-of"))
                path = child.get("path")
                v.set("select", f"name(({_substitute(path, renamed)})[1])" if path else "name()")
                v.set(_SRC, child.get(_SRC, ""))
            elif child.tag.startswith(f"{{{XSL_NS}}}"):
                target.append(self._foreign(child))
            else:
                self._content(target, child, renamed)
            text(child.tail)


# --------------------------------------------------------------------------- constant lets

_LITERAL_RESOURCE = re.compile(
    r"\b(?:doc|document|unparsed-text|unparsed-text-lines|json-doc)\s*\(\s*(['\"])([^'\"]*)\1")
_CONSTANT_TOKEN = re.compile(
    r"\s+|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+|[(),]"
    r"|(?:fn:)?(?P<function>[A-Za-z][\w-]*)\s*(?=\()")
# Functions whose result depends on their arguments only (no context, no document): a let that calls only
# these, with literals, is the same for every document. doc() and unparsed-text() of literal URIs read the
# rule set's own files, at compile time.
_CONSTANT_FUNCTIONS = frozenset({
    "tokenize", "concat", "string-join", "distinct-values", "normalize-space", "upper-case", "lower-case",
    "translate", "replace", "substring", "substring-before", "substring-after", "string", "number", "reverse",
    "true", "false", "codepoints-to-string", "doc", "unparsed-text", "unparsed-text-lines", "json-doc",
})


def _is_constant(expression: str) -> bool:
    """Whether a let's value is made of literals and context-free functions only."""
    position = 0
    seen = False
    while position < len(expression):
        m = _CONSTANT_TOKEN.match(expression, position)
        if not m or m.end() == position:
            return False
        if m.group("function") is not None:
            if m.group("function") not in _CONSTANT_FUNCTIONS:
                return False
        if not m.group(0).isspace():
            seen = True
        position = m.end()
    return seen


def _resource_file(href: str, main: Path, files: dict[str, str]) -> None:
    """Record a local file a literal doc() / unparsed-text() names (relative to the main rule file)."""
    parts = urllib.parse.urlsplit(href)
    if parts.scheme not in ("", "file"):
        return
    path = (main.parent / urllib.parse.unquote(parts.path)).resolve()
    try:
        files.setdefault(str(path), _sha256(path.read_bytes()))
    except OSError:
        pass  # Saxon reports it when the stylesheet compiles, or the rule fails on a document


# --------------------------------------------------------------------------- rule contexts

def _split_top(text: str, separator: str) -> list[str]:
    """*text* split at *separator* where it is outside brackets, parentheses, braces and string literals."""
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    start = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            i += len(separator)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return parts


def _alternatives(context: str) -> list[str]:
    return [a.strip() for part in _split_top(context, "|") for a in _split_top(part, " union ")]


def _context_select(context: str) -> str:
    """The expression selecting, from the document node, every node the match pattern *context* matches:
    an absolute path as it is, a relative one after ``//`` (as XSLT defines matching)."""
    selects = []
    for alt in _alternatives(context):
        if alt.startswith("/"):
            selects.append(alt)
        elif alt.startswith("document-node("):
            selects.append(f"(/)[self::{alt}]")
        else:
            selects.append(f"//{alt}")
    return selects[0] if len(selects) == 1 else " | ".join(f"({s})" for s in selects)


_STEP_TEST = re.compile(r"^(@|attribute::|child::)?(?:([A-Za-z_][\w.\-]*|\*):)?([A-Za-z_][\w.\-]*|\*)$")
_Test = tuple[str, "str | None", "str | None"]  # (kind, namespace or None for any, local name or None for any)
_Shape = tuple[bool, list["_Test | None"]]  # (anchored at the root, step tests; None: a step that can be anything)


def _shapes(context: str, namespaces: dict[str, str]) -> list[_Shape] | None:
    """The steps each alternative of a match pattern requires, from the last ``//`` on (None when they
    cannot be told: a function, a variable, a filter...)."""
    out: list[_Shape] = []
    for alt in _alternatives(context):
        steps = _split_top(alt, "/")
        anchored = steps[0].strip() == ""
        if anchored:
            steps = steps[1:]
        if "" in (s.strip() for s in steps):  # a '//': keep what follows the last one, unanchored
            last = max(i for i, s in enumerate(steps) if not s.strip())
            steps, anchored = steps[last + 1:], False
        tests: list[_Test | None] = []
        for step in steps:
            bare = without_predicates(step) or ""  # unbalanced: a pattern Saxon refuses
            m = _STEP_TEST.match(bare.strip())
            if not m:
                if bare.strip() in ("node()", "*"):
                    tests.append(None)
                    continue
                return None
            kind = "attribute" if m.group(1) in ("@", "attribute::") else "element"
            prefix, local = m.group(2), m.group(3)
            if prefix is None:
                ns: str | None = None if local == "*" else ""
            elif prefix == "*":
                ns = None
            elif prefix in namespaces:
                ns = namespaces[prefix]
            else:
                return None
            tests.append((kind, ns, None if local == "*" else local))
        if not tests and not anchored:
            return None
        out.append((anchored, tests))
    return out


def _compatible(a: _Test | None, b: _Test | None) -> bool:
    if a is None or b is None:
        return True
    return a[0] == b[0] and (a[1] is None or b[1] is None or a[1] == b[1]) and (
        a[2] is None or b[2] is None or a[2] == b[2])


def _may_overlap(a: list[_Shape] | None, b: list[_Shape] | None) -> bool:
    """Whether two rule contexts may match a node in common (False only when their steps show they can't:
    different names at some level from the node up, or fixed depths that differ)."""
    if a is None or b is None:
        return True
    for anchored, steps in a:
        for anchored2, steps2 in b:
            if anchored and anchored2 and len(steps) != len(steps2):
                continue
            if (anchored and len(steps2) > len(steps)) or (anchored2 and len(steps) > len(steps2)):
                continue
            if all(_compatible(x, y) for x, y in zip(reversed(steps), reversed(steps2))):
                return True
    return False


def _serialise(sheet: etree._Element) -> tuple[str, dict[int, tuple[int, int]]]:
    """The stylesheet text (each element on its own line), and for each line holding a marked element the
    (file index, line) it comes from; the markers themselves are left out of the text."""
    for el in sheet.iter(etree.Element):  # whitespace-only text is not significant in a stylesheet...
        if el.tag == _xsl("text") or el.get("{http://www.w3.org/XML/1998/namespace}space") == "preserve":
            continue  # ... except there
        if el.text is not None and not el.text.strip() and len(el):
            el.text = None
        for child in el:
            if child.tail is not None and not child.tail.strip():
                child.tail = None
    text = etree.tostring(sheet, encoding="unicode", pretty_print=True)
    marks: dict[int, tuple[int, int]] = {}
    reparsed = etree.fromstring(text)
    for el in reparsed.iter(etree.Element):
        mark = el.attrib.pop(_SRC, None)
        if mark and el.sourceline:
            index, line = mark.split(":", 1)
            marks.setdefault(el.sourceline, (int(index), int(line)))
    etree.cleanup_namespaces(reparsed, keep_ns_prefixes=[p for p in reparsed.nsmap if p])  # XPaths use them
    clean = etree.tostring(reparsed, encoding="unicode")  # the same lines: attributes never wrap
    return clean, marks


def compile_schematron(path: str | Path, phase: str | None = None) -> CompiledSchematron:
    """Compile the ISO Schematron file at *path* (with *phase*, default: its ``defaultPhase``, else every
    pattern) to an XSLT 3.0 stylesheet. Raises :class:`SchematronError` with ``file:line`` for a rule file
    that cannot be used (the XPaths are checked when Saxon compiles the stylesheet: :class:`SaxonRules`)."""
    file = Path(path).absolute()
    reader = _Reader()
    root = reader.read(file)
    compiler = _Compiler(reader, root, phase)
    sheet, binding, title, phase_id = compiler.compile()
    xslt, marks = _serialise(sheet)
    line_map = {line: (reader.file_names[index], src) for line, (index, src) in marks.items()}
    return CompiledSchematron(path=str(file), phase=phase_id, query_binding=binding, title=title, xslt=xslt,
                              assertions=compiler.assertions, files=dict(reader.files), line_map=line_map,
                              namespaces=dict(compiler.namespaces))


# --------------------------------------------------------------------------- the cache


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/b2bgw/rules`` (``~/.cache/b2bgw/rules``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "b2bgw" / "rules"


def _cache_file(cache_dir: Path, path: Path, phase: str | None) -> Path:
    key = _sha256(f"{COMPILER_VERSION}\0{path}\0{phase or ''}".encode("utf-8"))
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


def load_schematron(path: str | Path, phase: str | None = None, *, cache_dir: str | Path | None = None,
                    check: SaxonRules | None = None) -> CompiledSchematron:
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
            with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=entry.parent, delete=False,
                                             prefix=".tmp-", suffix=".json") as out:
                out.write(compiled.to_json())
            os.replace(out.name, entry)
        except OSError as exc:
            log.warning("could not write the rule set cache %s: %s", entry, exc)
    return compiled


# --------------------------------------------------------------------------- running (SaxonC-HE)

_XML_DECLARATION = re.compile(r"^\ufeff?\s*<\?xml[^>]*\?>")


def document_text(root: etree._Element, decoded: str | None = None) -> str:
    """The text Saxon parses for a document the intake has parsed: its own (UTF-8) text without the XML
    declaration (so Saxon reads it as XML 1.0, like the intake did), or lxml's serialisation of the tree."""
    if decoded is not None:
        return _XML_DECLARATION.sub("", decoded, count=1)
    return etree.tostring(root, encoding="unicode")


_XML_DECLARATION_UTF8 = re.compile(rb"^(?:\xef\xbb\xbf)?\s*<\?xml[^>]*\?>")


def document_utf8(root: etree._Element, body: bytes, utf8: bool) -> bytes:
    """:func:`document_text` encoded in UTF-8: the received bytes themselves when they are UTF-8 (*utf8*:
    the intake decoded them as such), without byte order mark and XML declaration."""
    if utf8:
        return _XML_DECLARATION_UTF8.sub(b"", body, count=1)
    return etree.tostring(root, encoding="UTF-8")


_SAXON_ERROR = re.compile(r"on line (\d+)(?: column \d+)? of (\S+?):\s*\n\s*(\S+)\s+(.*?)(?=\n\S|\Z)", re.S)
_PARSER_FEATURE = "http://saxon.sf.net/feature/parserFeature?uri=" + urllib.parse.quote(
    "http://apache.org/xml/features/disallow-doctype-decl", safe="")


class SaxonRules:
    """Compiled rule sets run by one SaxonC-HE processor (not thread-safe: one per thread or process).

    :meth:`add` compiles a rule set (XSLT includes may read local files meanwhile); :meth:`lock` then
    refuses every URI access for good; :meth:`run` parses a document once and runs the rule sets given.
    """

    def __init__(self) -> None:
        import saxonche

        self._saxon = saxonche
        self.proc = saxonche.PySaxonProcessor(license=False)
        self.proc.set_configuration_property(_PARSER_FEATURE, "true")  # no DOCTYPE, so no entity at all
        self.proc.set_configuration_property("http://saxon.sf.net/feature/allow-external-functions", "false")
        self.proc.set_configuration_property("http://saxon.sf.net/feature/preEvaluateDocFunction", "true")
        self.proc.set_configuration_property("http://saxon.sf.net/feature/allowedProtocols", "file")
        self.compiler = self.proc.new_xslt30_processor()
        self.sets: list[tuple[CompiledSchematron, Any]] = []
        self.locked = False

    def _compile(self, compiled: CompiledSchematron) -> Any:
        if self.locked:
            raise RuntimeError("the processor is locked: compile every rule set before running documents")
        self.compiler.set_cwd(str(Path(compiled.path).parent))
        try:
            executable = self.compiler.compile_stylesheet(stylesheet_text=compiled.xslt)
        except self._saxon.PySaxonApiError as exc:
            raise _compile_error(compiled, str(exc)) from None
        executable.set_initial_mode(MAIN_MODE)
        return executable

    def check(self, compiled: CompiledSchematron) -> None:
        """Raise the SchematronError of a rule set whose stylesheet does not compile (else nothing)."""
        self._compile(compiled)

    def add(self, compiled: CompiledSchematron) -> int:
        """Compile a rule set for :meth:`run`; returns its number."""
        self.sets.append((compiled, self._compile(compiled)))
        return len(self.sets) - 1

    def lock(self) -> None:
        """Refuse every URI access from now on (the rule sets are compiled)."""
        self.proc.set_configuration_property("http://saxon.sf.net/feature/allowedProtocols", "")
        self.locked = True

    def parse(self, text: str) -> Any:
        """Saxon's tree of a document's text (raises the PySaxonApiError of a parse failure)."""
        return self.proc.parse_xml(xml_text=text, encoding="UTF-8")

    def run_raw(self, text: str, numbers: list[int] | None = None) -> list[str]:
        """The raw output of each rule set (all, or *numbers*) on the document *text*."""
        if not self.locked:
            self.lock()
        node = self.parse(text)
        out = []
        for number in (range(len(self.sets)) if numbers is None else numbers):
            executable = self.sets[number][1]
            executable.set_global_context_item(xdm_item=node)
            out.append(executable.apply_templates_returning_string(xdm_value=node, encoding="UTF-8") or "")
        return out

    def run(self, text: str, numbers: list[int] | None = None) -> list[Finding]:
        """The findings of the rule sets (all, or *numbers*) on the document *text*."""
        chosen = list(range(len(self.sets))) if numbers is None else numbers
        findings: list[Finding] = []
        for number, raw in zip(chosen, self.run_raw(text, chosen)):
            findings.extend(parse_output(self.sets[number][0], raw))
        return findings


def _compile_error(compiled: CompiledSchematron, message: str) -> SchematronError:
    """Saxon's compile errors, each at the rule file line its generated element came from."""
    errors: list[SchematronError] = []
    for m in _SAXON_ERROR.finditer(message):
        line, uri, code, text = int(m.group(1)), m.group(2), m.group(3), " ".join(m.group(4).split())
        detail = f"{code} {text}"
        if uri.endswith("/"):  # the generated stylesheet (compiled from text, based on its folder)
            where = compiled.line_map.get(line)
            if where is None:  # the nearest marked line before it
                before = [k for k in compiled.line_map if k <= line]
                where = compiled.line_map[max(before)] if before else (compiled.path, None)
            errors.append(SchematronError(f"XPath does not compile: {clip(detail, 300)}", file=where[0],
                                          line=where[1]))
        else:
            path = urllib.parse.unquote(urllib.parse.urlsplit(uri).path) if uri.startswith("file:") else uri
            errors.append(SchematronError(f"XSLT does not compile: {clip(detail, 300)}", file=path, line=line))
    if not errors:
        errors.append(SchematronError(f"the rule set does not compile: {clip(' '.join(message.split()), 400)}",
                                      file=compiled.path))
    first = errors[0]
    return SchematronError(first.detail, file=first.file, line=first.line, errors=errors)


def parse_output(compiled: CompiledSchematron, raw: str, limit: int | None = None) -> list[Finding]:
    """The findings in a rule set's text output (at most *limit*)."""
    if not raw:
        return []
    findings = []
    assertions = compiled.assertions
    for record in raw.split(_RS)[1:]:
        fields = record.split(_FS)
        if len(fields) < 3:
            continue
        try:
            assertion = assertions[int(fields[0])]
        except (ValueError, IndexError):
            continue
        path = fields[1]
        text = " ".join(fields[2].split())
        diagnostics = tuple(" ".join(d.split()) for d in fields[3].split(_LS)) if len(fields) > 3 else ()
        findings.append(Finding(assertion, compiled.display_path(path), text, diagnostics, path))
        if limit is not None and len(findings) >= limit:
            break
    return findings


def locate(root: etree._Element, path: str) -> etree._Element | None:
    """The element of an lxml tree that a finding's ``fn:path()`` names (for an attribute or a text node:
    its element), or None when the tree does not have it."""
    el: etree._Element | None = None
    for m in _PATH_STEP.finditer(path):
        if m.group(4):  # an attribute, text, comment or PI: its element is the node to show
            break
        tag = f"{{{m.group(1)}}}{m.group(2)}" if m.group(1) else m.group(2)
        position = int(m.group(3))
        if el is None:
            if root.tag != tag or position != 1:
                return None
            el = root
            continue
        found = None
        for i, child in enumerate(el.iterchildren(tag), 1):
            if i == position:
                found = child
                break
        if found is None:
            return None
        el = found
    return el
