"""Compiled rule sets run by SaxonC-HE on untrusted documents: no DOCTYPE, no URI access once compiled,
and each finding placed on the document's element."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Any

from lxml import etree

from gateway.errors import clip
from gateway.rules.compiled import _FS, _LS, _PATH_STEP, _RS, MAIN_MODE, CompiledSchematron, Finding, SchematronError

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
    "http://apache.org/xml/features/disallow-doctype-decl", safe=""
)


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
        for number in range(len(self.sets)) if numbers is None else numbers:
            executable = self.sets[number][1]
            executable.set_global_context_item(xdm_item=node)
            out.append(executable.apply_templates_returning_string(xdm_value=node, encoding="UTF-8") or "")
        return out

    def run(self, text: str, numbers: list[int] | None = None) -> list[Finding]:
        """The findings of the rule sets (all, or *numbers*) on the document *text*."""
        chosen = list(range(len(self.sets))) if numbers is None else numbers
        findings: list[Finding] = []
        for number, raw in zip(chosen, self.run_raw(text, chosen), strict=False):
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
            errors.append(SchematronError(f"XPath does not compile: {clip(detail, 300)}", file=where[0], line=where[1]))
        else:
            path = urllib.parse.unquote(urllib.parse.urlsplit(uri).path) if uri.startswith("file:") else uri
            errors.append(SchematronError(f"XSLT does not compile: {clip(detail, 300)}", file=path, line=line))
    if not errors:
        errors.append(
            SchematronError(
                f"the rule set does not compile: {clip(' '.join(message.split()), 400)}", file=compiled.path
            )
        )
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
