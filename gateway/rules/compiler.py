"""ISO Schematron compiled to one XSLT 3.0 stylesheet: abstract patterns and rules expanded, the phase
selected, each rule an ``xsl:for-each`` over its context's nodes, lets as variables."""

from __future__ import annotations

import copy
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from lxml import etree

from gateway.rules.compiled import (
    _FS,
    _LS,
    _NAME,
    _RS,
    _SRC,
    _SRC_NS,
    _VARIABLE_REF,
    MAIN_MODE,
    OLD_SCH_NS,
    OWN_NS,
    QUERY_BINDINGS,
    SCH_NS,
    XSL_NS,
    Assertion,
    CompiledSchematron,
    SchematronError,
)
from gateway.rules.contexts import _context_select, _may_overlap, _Shape, _shapes
from gateway.rules.reading import _Reader, _sha256, _xslt_module_files

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
            raise self.error(
                root,
                f"this is Schematron 1.5 (namespace http://www.ascc.net/xml/schematron); ISO Schematron uses {SCH_NS}",
            )
        if root.tag != _sch("schema"):
            raise self.error(
                root, f"not an ISO Schematron schema: the root element is {root.tag!r}, expected schema in {SCH_NS}"
            )
        binding = (root.get("queryBinding") or "xslt").strip().lower()
        if binding not in QUERY_BINDINGS:
            raise self.error(
                root, f"queryBinding {binding!r} is not supported (use one of {', '.join(QUERY_BINDINGS)})"
            )
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
            foreign += [el for el in pattern.element if isinstance(el.tag, str) and el.tag.startswith(f"{{{XSL_NS}}}")]
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
        for number, (pattern, renamed) in enumerate(zip(active, renames, strict=False), 1):
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
        for node in copied.iter(etree.Element):
            if not node.tag.startswith(f"{{{XSL_NS}}}"):
                node.attrib.pop(_SRC, None)
        if name in ("include", "import"):
            href = self.required(el, "href")
            path = _xslt_module_files(href, self.reader.file_of(el), self.reader.files, self.reader.where(el))
            copied.set("href", path.as_uri())
        return copied

    def _global_let(
        self,
        sheet: etree._Element,
        let: etree._Element,
        taken: dict[str, etree._Element],
        renamed: dict[str, str],
        scope: str | None = None,
    ) -> None:
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
                raise self.error(
                    el,
                    "pattern/@documents (subordinate documents) is not supported: rules may not load other documents",
                )
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
            elif child.tag in (_sch("let"), _sch("assert"), _sch("report")) or (child.tag.startswith(f"{{{XSL_NS}}}")):
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

    def _pattern(
        self, main: etree._Element, number: int, pattern: _Pattern, renamed: dict[str, str], binding: str
    ) -> None:
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
                for r in pattern.rules[k:]
            )
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

    def _rule_child(
        self,
        body: etree._Element,
        child: etree._Element,
        rule: _Rule,
        pattern: _Pattern,
        renamed: dict[str, str],
        binding: str,
    ) -> None:
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
            index=len(self.assertions),
            kind=kind,
            id=child.get("id"),
            flag=child.get("flag") or rule_el.get("flag"),
            role=child.get("role") or rule_el.get("role"),
            see=child.get("see") or rule_el.get("see") or pattern.element.get("see"),
            pattern=pattern.id,
            test=test,
            file=file,
            line=line,
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

    def _message_instructions(
        self, check: etree._Element, parts: list[str], messages: list[etree._Element], renamed: dict[str, str]
    ) -> None:
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
    r"\b(?:doc|document|unparsed-text|unparsed-text-lines|json-doc)\s*\(\s*(['\"])([^'\"]*)\1"
)
_CONSTANT_TOKEN = re.compile(
    r"\s+|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+|[(),]"
    r"|(?:fn:)?(?P<function>[A-Za-z][\w-]*)\s*(?=\()"
)
# Functions whose result depends on their arguments only (no context, no document): a let that calls only
# these, with literals, is the same for every document. doc() and unparsed-text() of literal URIs read the
# rule set's own files, at compile time.
_CONSTANT_FUNCTIONS = frozenset(
    {
        "tokenize",
        "concat",
        "string-join",
        "distinct-values",
        "normalize-space",
        "upper-case",
        "lower-case",
        "translate",
        "replace",
        "substring",
        "substring-before",
        "substring-after",
        "string",
        "number",
        "reverse",
        "true",
        "false",
        "codepoints-to-string",
        "doc",
        "unparsed-text",
        "unparsed-text-lines",
        "json-doc",
    }
)


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
    return CompiledSchematron(
        path=str(file),
        phase=phase_id,
        query_binding=binding,
        title=title,
        xslt=xslt,
        assertions=compiler.assertions,
        files=dict(reader.files),
        line_map=line_map,
        namespaces=dict(compiler.namespaces),
    )
