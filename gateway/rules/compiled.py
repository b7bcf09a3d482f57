"""What a compiled rule set is: its assertions, its findings on a document, and the errors of a rule file.

The compiler, the cache and the runner share these; a :class:`CompiledSchematron` is what the cache keeps."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ConfigError

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

    def __init__(
        self,
        detail: str | None = None,
        *,
        file: str | None = None,
        line: int | None = None,
        errors: list[SchematronError] | None = None,
    ) -> None:
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
        return {
            "index": self.index,
            "kind": self.kind,
            "id": self.id,
            "flag": self.flag,
            "role": self.role,
            "see": self.see,
            "pattern": self.pattern,
            "test": self.test,
            "file": self.file,
            "line": self.line,
        }

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
        out: dict[str, Any] = {
            "id": self.assertion.id,
            "flag": self.assertion.flag,
            "location": self.location,
            "text": self.text,
        }
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
        return json.dumps(
            {
                "version": COMPILER_VERSION,
                "path": self.path,
                "phase": self.phase,
                "query_binding": self.query_binding,
                "title": self.title,
                "xslt": self.xslt,
                "assertions": [a.to_dict() for a in self.assertions],
                "files": self.files,
                "line_map": {str(k): list(v) for k, v in self.line_map.items()},
                "namespaces": self.namespaces,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> CompiledSchematron:
        data = json.loads(text)
        if data.get("version") != COMPILER_VERSION:
            raise ValueError("compiled by another version")
        return cls(
            path=data["path"],
            phase=data["phase"],
            query_binding=data["query_binding"],
            title=data["title"],
            xslt=data["xslt"],
            assertions=[Assertion.from_dict(a) for a in data["assertions"]],
            files=data["files"],
            line_map={int(k): (v[0], v[1]) for k, v in data["line_map"].items()},
            namespaces=data["namespaces"],
            from_cache=True,
        )
