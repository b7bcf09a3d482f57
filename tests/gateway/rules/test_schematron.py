"""The Schematron engine (gateway.rules.schematron), one ISO Schematron construct at a time.

Each test writes a small rule set for its construct and checks what ISO/IEC 19757-3 says the
findings are: failed asserts, successful reports, their id, flag, location and text.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree
from saxonche import PySaxonApiError

from gateway.rules.schematron import (
    SaxonRules,
    SchematronError,
    compile_schematron,
    document_text,
    load_schematron,
    locate,
)

SCH = "http://purl.oclc.org/dsdl/schematron"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).strip() + "\n", encoding="utf-8")
    return path


def schema(body: str, *, binding: str = "xslt2", attrs: str = "") -> str:
    return (
        f'<sch:schema xmlns:sch="{SCH}" xmlns:xsl="http://www.w3.org/1999/XSL/Transform" '
        f'xmlns:xs="http://www.w3.org/2001/XMLSchema" queryBinding="{binding}" {attrs}>\n'
        f'<sch:ns prefix="o" uri="urn:o"/>\n<sch:ns prefix="xs" uri="http://www.w3.org/2001/XMLSchema"/>\n'
        f"{textwrap.dedent(body).strip()}\n</sch:schema>"
    )


def engine(tmp_path: Path, body: str, *, phase: str | None = None, name: str = "rules.sch", **kw) -> SaxonRules:
    path = write(tmp_path / name, schema(body, **kw))
    rules = SaxonRules()
    rules.add(compile_schematron(path, phase))
    return rules


def findings(rules: SaxonRules, xml: str) -> list[tuple[str | None, str, str]]:
    return [(f.assertion.id, f.location, f.text) for f in rules.run(xml)]


ORDER = '<o:order xmlns:o="urn:o"><o:line id="1" q="2"/><o:line id="2" q="0"/><o:line id="2" q="5"/></o:order>'


# --------------------------------------------------------------------------- assert, report, messages


def test_failed_asserts_and_successful_reports_with_their_attributes(tmp_path):
    rules = engine(
        tmp_path,
        """
        <sch:pattern id="p">
          <sch:rule context="o:line">
            <sch:assert id="Q" test="@q > 0" flag="fatal" role="error" see="http://example.com/q">Line
              <sch:value-of select="@id"/> has no quantity in <sch:name/> (<sch:name path=".."/>).</sch:assert>
            <sch:report id="BIG" test="@q > 4" flag="information">Big line <sch:emph>quantity</sch:emph>.</sch:report>
          </sch:rule>
        </sch:pattern>""",
    )
    found = rules.run(ORDER)
    assert [(f.assertion.id, f.assertion.kind, f.location, f.text) for f in found] == [
        ("Q", "assert", "/o:order[1]/o:line[2]", "Line 2 has no quantity in o:line (o:order)."),
        ("BIG", "report", "/o:order[1]/o:line[3]", "Big line quantity."),
    ]
    q = found[0].assertion
    assert (q.flag, q.role, q.see, q.pattern, q.test) == ("fatal", "error", "http://example.com/q", "p", "@q > 0")
    assert found[0].is_error and not found[1].is_error


@pytest.mark.parametrize(
    "flag, error",
    [
        (None, True),
        ("fatal", True),
        ("error", True),
        ("FATAL", True),
        ("warning", False),
        ("information", False),
        ("info", False),
        ("custom", True),
    ],
)
def test_flags_that_refuse_a_document(tmp_path, flag, error):
    attr = f' flag="{flag}"' if flag else ""
    rules = engine(
        tmp_path,
        f'<sch:pattern><sch:rule context="o:line"><sch:assert test="false()"{attr}>x'
        f"</sch:assert></sch:rule></sch:pattern>",
    )
    assert all(f.is_error is error for f in rules.run(ORDER))


def test_an_unflagged_report_informs_and_a_flagged_one_takes_its_flag(tmp_path):
    rules = engine(
        tmp_path,
        """
        <sch:pattern><sch:rule context="o:order">
          <sch:report id="R1" test="true()">noticed</sch:report>
          <sch:report id="R2" test="true()" flag="fatal">refused</sch:report>
        </sch:rule></sch:pattern>""",
    )
    assert [(f.assertion.id, f.is_error) for f in rules.run(ORDER)] == [("R1", False), ("R2", True)]


def test_diagnostics_are_evaluated_in_the_rule_context(tmp_path):
    rules = engine(
        tmp_path,
        """
        <sch:pattern><sch:rule context="o:line">
          <sch:assert id="A" test="@q > 0" diagnostics="d1 d2">no quantity</sch:assert>
        </sch:rule></sch:pattern>
        <sch:diagnostics>
          <sch:diagnostic id="d1">line <sch:value-of select="@id"/></sch:diagnostic>
          <sch:diagnostic id="d2">q=<sch:value-of select="@q"/></sch:diagnostic>
        </sch:diagnostics>""",
    )
    (found,) = rules.run(ORDER)
    assert found.diagnostics == ("line 2", "q=0")
    assert found.to_dict()["diagnostics"] == ["line 2", "q=0"]


def test_value_of_joins_a_sequence_with_spaces(tmp_path):
    rules = engine(
        tmp_path,
        '<sch:pattern><sch:rule context="o:order"><sch:report test="true()">ids: '
        '<sch:value-of select="o:line/@id"/></sch:report></sch:rule></sch:pattern>',
    )
    assert findings(rules, ORDER) == [(None, "/o:order[1]", "ids: 1 2 2")]


def test_separator_characters_in_the_document_are_dropped_from_messages(tmp_path):
    rules = engine(
        tmp_path,
        '<sch:pattern><sch:rule context="o:line"><sch:assert id="A" test="false()">'
        '<sch:value-of select="@id"/></sch:assert></sch:rule></sch:pattern>',
    )
    text = '<o:order xmlns:o="urn:o"><o:line id="a\ue0000\ue001/\ue002b"/></o:order>'
    assert findings(rules, text) == [("A", "/o:order[1]/o:line[1]", "a0/b")]


def test_subject_moves_the_location(tmp_path):
    rules = engine(
        tmp_path,
        '<sch:pattern><sch:rule context="o:line" subject="@q"><sch:assert id="A" '
        'test="@q > 0">x</sch:assert></sch:rule></sch:pattern>',
    )
    assert findings(rules, ORDER) == [("A", "/o:order[1]/o:line[2]/@q", "x")]


# --------------------------------------------------------------------------- patterns and rules


def test_within_a_pattern_a_node_is_taken_by_the_first_rule_whose_context_matches(tmp_path):
    rules = engine(
        tmp_path,
        """
        <sch:pattern>
          <sch:rule context="o:line[@id = '2']"><sch:report id="FIRST" test="true()">first</sch:report></sch:rule>
          <sch:rule context="o:line"><sch:report id="SECOND" test="true()">second</sch:report></sch:rule>
          <sch:rule context="*"><sch:report id="ANY" test="true()">any</sch:report></sch:rule>
        </sch:pattern>
        <sch:pattern>
          <sch:rule context="o:line"><sch:report id="OTHER" test="true()">other pattern</sch:report></sch:rule>
        </sch:pattern>""",
    )
    got = sorted((f.assertion.id, f.location) for f in rules.run(ORDER))
    assert got == sorted(
        [
            ("ANY", "/o:order[1]"),
            ("SECOND", "/o:order[1]/o:line[1]"),
            ("FIRST", "/o:order[1]/o:line[2]"),
            ("FIRST", "/o:order[1]/o:line[3]"),
            ("OTHER", "/o:order[1]/o:line[1]"),
            ("OTHER", "/o:order[1]/o:line[2]"),
            ("OTHER", "/o:order[1]/o:line[3]"),
        ]
    )


def test_a_group_fires_every_rule_whose_context_matches(tmp_path):
    rules = engine(
        tmp_path,
        """
        <sch:group>
          <sch:rule context="o:line[@id = '1']"><sch:report id="A" test="true()">a</sch:report></sch:rule>
          <sch:rule context="o:line"><sch:report id="B" test="@id = '1'">b</sch:report></sch:rule>
        </sch:group>""",
    )
    assert sorted(f.assertion.id for f in rules.run(ORDER)) == ["A", "B"]


def test_contexts_on_attributes_text_and_the_document_node(tmp_path):
    rules = engine(
        tmp_path,
        """
        <sch:pattern><sch:rule context="o:line/@q"><sch:assert id="ATTR" test=". > 0">attr</sch:assert></sch:rule></sch:pattern>
        <sch:pattern><sch:rule context="o:note/text()"><sch:assert id="TEXT" test="string-length(.) lt 5">text</sch:assert></sch:rule></sch:pattern>
        <sch:pattern><sch:rule context="/"><sch:assert id="ROOT" test="o:order/o:note">root</sch:assert></sch:rule></sch:pattern>""",
    )
    assert findings(rules, ORDER) == [("ATTR", "/o:order[1]/o:line[2]/@q", "attr"), ("ROOT", "/", "root")]
    noted = '<o:order xmlns:o="urn:o"><o:note>too long</o:note></o:order>'
    assert findings(rules, noted) == [("TEXT", "/o:order[1]/o:note[1]/text()[1]", "text")]


def test_abstract_rules_are_extended_in_place(tmp_path):
    rules = engine(
        tmp_path,
        """
        <sch:pattern>
          <sch:rule abstract="true" id="has-id"><sch:assert id="ID" test="@id">no id</sch:assert></sch:rule>
          <sch:rule abstract="true" id="line"><sch:extends rule="has-id"/>
            <sch:assert id="Q" test="@q > 0">no quantity on <sch:value-of select="@id"/></sch:assert></sch:rule>
          <sch:rule context="o:line"><sch:let name="x" value="1"/><sch:extends rule="line"/></sch:rule>
        </sch:pattern>""",
    )
    assert findings(rules, ORDER.replace('id="1" ', "")) == [
        ("ID", "/o:order[1]/o:line[1]", "no id"),
        ("Q", "/o:order[1]/o:line[2]", "no quantity on 2"),
    ]


def test_abstract_patterns_are_instantiated_with_their_parameters(tmp_path):
    rules = engine(
        tmp_path,
        """
        <sch:pattern abstract="true" id="positive">
          <sch:rule context="$item"><sch:assert id="POS-$name" test="$value > 0">$name must be positive:
            <sch:value-of select="$value"/></sch:assert></sch:rule>
        </sch:pattern>
        <sch:pattern is-a="positive" id="line-q">
          <sch:param name="item" value="o:line"/><sch:param name="value" value="@q"/><sch:param name="name" value="'q'"/>
        </sch:pattern>
        <sch:pattern is-a="positive" id="order-total">
          <sch:param name="item" value="o:order"/><sch:param name="value" value="sum(o:line/@q) - 7"/>
          <sch:param name="name" value="'total'"/>
        </sch:pattern>""",
    )
    found = rules.run(ORDER)
    assert [(f.assertion.pattern, f.location, f.assertion.test) for f in found] == [
        ("line-q", "/o:order[1]/o:line[2]", "@q > 0"),
        ("order-total", "/o:order[1]", "sum(o:line/@q) - 7 > 0"),
    ]
    assert found[0].text == "$name must be positive: 0"  # text is not substituted, attributes are


def test_parameter_names_are_whole_names(tmp_path):
    rules = engine(
        tmp_path,
        """
        <sch:pattern abstract="true" id="t">
          <sch:rule context="$R-1"><sch:assert id="A" test="$R-10">x</sch:assert></sch:rule>
        </sch:pattern>
        <sch:pattern is-a="t"><sch:param name="R-1" value="o:line"/><sch:param name="R-10" value="@q != 0"/></sch:pattern>""",
    )
    assert findings(rules, ORDER) == [("A", "/o:order[1]/o:line[2]", "x")]


# --------------------------------------------------------------------------- let


def test_lets_of_the_schema_the_pattern_and_the_rule(tmp_path):
    rules = engine(
        tmp_path,
        """
        <sch:let name="min" value="1"/>
        <sch:pattern>
          <sch:let name="lines" value="count(//o:line)"/>
          <sch:rule context="o:line">
            <sch:let name="q" value="number(@q)"/>
            <sch:assert id="A" test="$q >= $min">q <sch:value-of select="$q"/> of <sch:value-of select="$lines"/> lines</sch:assert>
          </sch:rule>
        </sch:pattern>""",
    )
    assert findings(rules, ORDER) == [("A", "/o:order[1]/o:line[2]", "q 0 of 3 lines")]


def test_patterns_may_declare_the_same_let_name(tmp_path):
    rules = engine(
        tmp_path,
        """
        <sch:pattern><sch:let name="v" value="'one'"/>
          <sch:rule context="o:order"><sch:report id="A" test="true()"><sch:value-of select="$v"/></sch:report></sch:rule></sch:pattern>
        <sch:pattern><sch:let name="v" value="count(o:order/o:line)"/>
          <sch:rule context="o:order"><sch:report id="B" test="true()"><sch:value-of select="$v"/></sch:report></sch:rule></sch:pattern>""",
    )
    assert sorted(findings(rules, ORDER)) == [("A", "/o:order[1]", "one"), ("B", "/o:order[1]", "3")]


def test_a_schema_let_declared_twice_is_an_error(tmp_path):
    with pytest.raises(SchematronError, match="declared twice") as caught:
        engine(tmp_path, '<sch:let name="a" value="1"/>\n<sch:let name="a" value="2"/>')
    assert caught.value.line == 5 and ":4)" in caught.value.detail


def test_a_let_with_content(tmp_path):
    rules = engine(
        tmp_path,
        """
        <sch:let name="codes"><code>A</code><code>B</code></sch:let>
        <sch:pattern><sch:rule context="o:line"><sch:assert id="C" test="@id = ('1', $codes/code)">x</sch:assert></sch:rule></sch:pattern>""",
    )
    assert [f.location for f in rules.run(ORDER)] == ["/o:order[1]/o:line[2]", "/o:order[1]/o:line[3]"]


# --------------------------------------------------------------------------- phases


PHASED = """
    <sch:phase id="quick"><sch:active pattern="ids"/></sch:phase>
    <sch:phase id="full"><sch:let name="limit" value="3"/><sch:active pattern="ids"/><sch:active pattern="q"/></sch:phase>
    <sch:pattern id="ids"><sch:rule context="o:line"><sch:assert id="ID" test="@id != '2'">id</sch:assert></sch:rule></sch:pattern>
    <sch:pattern id="q"><sch:rule context="o:line"><sch:assert id="Q" test="@q > 0 and @q &lt; $limit">q</sch:assert></sch:rule></sch:pattern>
"""


@pytest.mark.parametrize(
    "phase, expected", [("quick", {"ID"}), ("full", {"ID", "Q"}), (None, {"ID"}), ("#DEFAULT", {"ID"})]
)
def test_phases_and_the_default_phase(tmp_path, phase, expected):
    rules = engine(tmp_path, PHASED, phase=phase, attrs='defaultPhase="quick"')
    assert {f.assertion.id for f in rules.run(ORDER)} == expected


def test_all_patterns_without_a_phase(tmp_path):
    rules = engine(
        tmp_path, PHASED.replace('<sch:let name="limit" value="3"/>', "") + '<sch:let name="limit" value="3"/>'
    )
    assert {f.assertion.id for f in rules.run(ORDER)} == {"ID", "Q"}


def test_an_unknown_phase_is_an_error(tmp_path):
    with pytest.raises(SchematronError, match="phase 'nope' is not defined .*quick"):
        engine(tmp_path, PHASED, phase="nope")


# --------------------------------------------------------------------------- includes


def test_sch_include_and_xi_include_of_local_files(tmp_path):
    write(
        tmp_path / "lib" / "pattern.sch",
        f"""
        <sch:pattern xmlns:sch="{SCH}" id="inc">
          <sch:rule context="o:line"><sch:assert id="INC" test="@q > 0">included</sch:assert></sch:rule>
        </sch:pattern>""",
    )
    write(
        tmp_path / "lib" / "rules.sch",
        f"""
        <sch:library xmlns:sch="{SCH}">
          <sch:rule id="frag" abstract="true"><sch:report id="FRAG" test="@id = '1'">fragment</sch:report></sch:rule>
        </sch:library>""",
    )
    write(
        tmp_path / "lib" / "xi.sch",
        f"""
        <sch:pattern xmlns:sch="{SCH}"><sch:rule context="o:order">
          <sch:assert id="XI" test="count(o:line) > 3">xi</sch:assert></sch:rule></sch:pattern>""",
    )
    rules = engine(
        tmp_path,
        """
        <sch:include href="lib/pattern.sch"/>
        <xi:include xmlns:xi="http://www.w3.org/2001/XInclude" href="lib/xi.sch"/>
        <sch:pattern><sch:include href="lib/rules.sch#frag"/>
          <sch:rule context="o:line"><sch:extends rule="frag"/></sch:rule></sch:pattern>""",
    )
    assert {f.assertion.id for f in rules.run(ORDER)} == {"INC", "XI", "FRAG"}


def test_foreign_xslt_functions_keys_and_included_modules(tmp_path):
    write(
        tmp_path / "functions.xsl",
        """
        <xsl:stylesheet version="3.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform" xmlns:f="urn:f"
                        xmlns:xs="http://www.w3.org/2001/XMLSchema">
          <xsl:function name="f:double" as="xs:double"><xsl:param name="x"/><xsl:sequence select="number($x) * 2"/></xsl:function>
        </xsl:stylesheet>""",
    )
    rules = engine(
        tmp_path,
        """
        <sch:ns prefix="f" uri="urn:f"/>
        <xsl:include href="functions.xsl"/>
        <xsl:key name="line" match="o:line" use="@id"/>
        <xsl:function name="f:triple" as="xs:double" xmlns:f="urn:f"><xsl:param name="x"/><xsl:sequence select="number($x) * 3"/></xsl:function>
        <sch:pattern><sch:rule context="o:line">
          <sch:assert id="UNIQUE" test="count(key('line', @id)) = 1">duplicate id <sch:value-of select="@id"/></sch:assert>
          <sch:report id="F" test="f:double(@q) = 10 and f:triple(@q) = 15">five</sch:report>
        </sch:rule></sch:pattern>""",
    )
    assert findings(rules, ORDER) == [
        ("UNIQUE", "/o:order[1]/o:line[2]", "duplicate id 2"),
        ("UNIQUE", "/o:order[1]/o:line[3]", "duplicate id 2"),
        ("F", "/o:order[1]/o:line[3]", "five"),
    ]


# --------------------------------------------------------------------------- query bindings


def test_query_binding_xslt_has_xpath_1_semantics(tmp_path):
    body = (
        '<sch:pattern><sch:rule context="o:order"><sch:assert id="A" test="o:line/@q = 2 and '
        "string(o:line/@id) = '1' and o:line/@q + 1 = 3\">x</sch:assert></sch:rule></sch:pattern>"
    )
    assert findings(engine(tmp_path, body, binding="xslt"), ORDER) == []  # first node of each node-set
    with pytest.raises(PySaxonApiError):  # XPath 2: string() and + of three attributes is a type error
        engine(tmp_path, body, binding="xslt2", name="two.sch").run(ORDER)


def test_query_binding_xslt3_has_xpath_3_1(tmp_path):
    rules = engine(
        tmp_path,
        """
        <sch:let name="limits" value="map{'1': 1, '2': 4}"/>
        <sch:pattern><sch:rule context="o:line">
          <sch:assert id="M" test="@q => number() le $limits(string(@id))">over the limit</sch:assert>
        </sch:rule></sch:pattern>""",
        binding="xslt3",
    )
    assert findings(rules, ORDER) == [
        ("M", "/o:order[1]/o:line[1]", "over the limit"),
        ("M", "/o:order[1]/o:line[3]", "over the limit"),
    ]


def test_an_unsupported_query_binding_is_an_error(tmp_path):
    with pytest.raises(SchematronError, match="queryBinding 'stx' is not supported") as caught:
        engine(tmp_path, "", binding="stx")
    assert caught.value.line == 1


# --------------------------------------------------------------------------- errors at file:line


def test_an_xpath_that_does_not_compile_is_reported_at_its_line(tmp_path):
    write(
        tmp_path / "inc.sch",
        f"""
        <sch:pattern xmlns:sch="{SCH}">
          <sch:rule context="o:line">
            <sch:assert test="@q >">broken</sch:assert>
          </sch:rule>
        </sch:pattern>""",
    )
    path = write(
        tmp_path / "rules.sch",
        schema("""
        <sch:pattern><sch:rule context="o:line"><sch:assert test="nope:f(1)">unknown prefix</sch:assert></sch:rule></sch:pattern>
        <sch:include href="inc.sch"/>"""),
    )
    with pytest.raises(SchematronError) as caught:
        SaxonRules().add(compile_schematron(path))
    places = sorted((Path(e.file).name, e.line) for e in caught.value.errors)
    assert places == [("inc.sch", 3), ("rules.sch", 4)]
    assert all("does not compile" in e.detail for e in caught.value.errors)


@pytest.mark.parametrize(
    "text, message, line",
    [
        ("<sch:schema xmlns:sch='urn:other'/>", "not an ISO Schematron schema", 1),
        ("<schema xmlns='http://www.ascc.net/xml/schematron'/>", "Schematron 1.5", 1),
        (
            schema("<sch:pattern>\n<sch:rule><sch:assert test='1'>x</sch:assert></sch:rule></sch:pattern>"),
            "sch:rule needs a 'context'",
            5,
        ),
        (schema("<sch:pattern is-a='missing'/>"), "is-a 'missing': no abstract pattern", 4),
        (
            schema("<sch:pattern><sch:rule context='*'><sch:extends rule='x'/></sch:rule></sch:pattern>"),
            "sch:extends 'x': no abstract rule",
            4,
        ),
        (
            schema(
                "<sch:pattern><sch:rule context='*'><sch:assert test='1' diagnostics='d'>x</sch:assert>"
                "</sch:rule></sch:pattern>"
            ),
            "no sch:diagnostic has the id 'd'",
            4,
        ),
        (schema("<sch:include href='missing.sch'/>"), "sch:include 'missing.sch': no such file", 4),
        (schema("<sch:include href='https://example.com/rules.sch'/>"), "is not a local file", 4),
        (schema("<xsl:include href='missing.xsl'/>"), "missing.xsl", 4),
        (schema("<sch:pattern documents='doc(@href)'/>"), "subordinate documents", 4),
        ("<sch:schema xmlns:sch='http://purl.oclc.org/dsdl/schematron'>\n<sch:pattern>", "not well-formed", 2),
    ],
)
def test_rule_files_that_cannot_be_used(tmp_path, text, message, line):
    path = tmp_path / "bad.sch"
    path.write_text(text)
    with pytest.raises(SchematronError, match=message) as caught:
        load_schematron(path, check=SaxonRules())
    assert caught.value.line == line


def test_an_include_cycle_is_an_error(tmp_path):
    write(tmp_path / "a.sch", f'<sch:pattern xmlns:sch="{SCH}"><sch:include href="b.sch"/></sch:pattern>')
    write(tmp_path / "b.sch", f'<sch:rule xmlns:sch="{SCH}" context="*"><sch:include href="a.sch"/></sch:rule>')
    with pytest.raises(SchematronError, match="includes itself"):
        engine(tmp_path, '<sch:include href="a.sch"/>')


# --------------------------------------------------------------------------- untrusted documents


def test_documents_cannot_make_the_rules_read_files_or_the_network(tmp_path):
    secret = write(tmp_path / "secret.txt", "the secret")
    write(tmp_path / "secret.xml", "<secret>the secret</secret>")
    rules = engine(
        tmp_path,
        """
        <sch:pattern><sch:rule context="o:u"><sch:report id="TEXT" test="true()"><sch:value-of select="unparsed-text(.)"/></sch:report></sch:rule></sch:pattern>
        <sch:pattern><sch:rule context="o:d"><sch:report id="DOC" test="true()"><sch:value-of select="doc(string(.))"/></sch:report></sch:rule></sch:pattern>
        <sch:pattern><sch:rule context="o:a"><sch:report id="AVAIL" test="doc-available(string(.)) or unparsed-text-available(string(.))">available</sch:report></sch:rule></sch:pattern>
        <sch:pattern><sch:rule context="o:c"><sch:report id="COLL" test="true()"><sch:value-of select="count(collection(string(.)))"/></sch:report></sch:rule></sch:pattern>""",
    )
    uris = [
        secret.as_uri(),
        str(secret),
        "secret.txt",
        (tmp_path / "secret.xml").as_uri(),
        "secret.xml",
        "http://127.0.0.1:9/x",
        tmp_path.as_uri(),
    ]
    for uri in uris:
        assert findings(rules, f'<o:r xmlns:o="urn:o"><o:a>{uri}</o:a></o:r>') == []
        for element in ("u", "d", "c"):
            with pytest.raises(Exception) as caught:  # the rule fails: nothing is read
                rules.run(f'<o:r xmlns:o="urn:o"><o:{element}>{uri}</o:{element}></o:r>')
            assert "the secret" not in str(caught.value)


def test_a_literal_doc_in_the_rule_set_is_read_when_it_compiles(tmp_path):
    write(tmp_path / "codes.xml", "<codes><code>1</code></codes>")
    rules = engine(
        tmp_path,
        """
        <sch:let name="codes" value="doc('codes.xml')"/>
        <sch:pattern><sch:rule context="o:line"><sch:assert id="C" test="@id = $codes//code">unknown</sch:assert></sch:rule></sch:pattern>""",
    )
    assert [f.location for f in rules.run(ORDER)] == ["/o:order[1]/o:line[2]", "/o:order[1]/o:line[3]"]


def test_saxon_refuses_a_doctype(tmp_path):
    rules = engine(
        tmp_path, '<sch:pattern><sch:rule context="*"><sch:report test="true()">x</sch:report></sch:rule></sch:pattern>'
    )
    with pytest.raises(Exception, match="DOCTYPE"):
        rules.run('<!DOCTYPE r [<!ENTITY e SYSTEM "file:///etc/hostname">]><r>&e;</r>')


# --------------------------------------------------------------------------- the cache


def test_the_cache_is_keyed_by_every_source_file(tmp_path):
    cache = tmp_path / "cache"
    write(
        tmp_path / "inc.sch",
        f'<sch:pattern xmlns:sch="{SCH}"><sch:rule context="o:line">'
        f'<sch:assert id="A" test="@q > 0">a</sch:assert></sch:rule></sch:pattern>',
    )
    path = write(tmp_path / "rules.sch", schema('<sch:include href="inc.sch"/>'))
    first = load_schematron(path, cache_dir=cache)
    again = load_schematron(path, cache_dir=cache)
    assert not first.from_cache and again.from_cache and again.xslt == first.xslt
    assert set(again.files) == {str(path), str(tmp_path / "inc.sch")}
    write(
        tmp_path / "inc.sch",
        f'<sch:pattern xmlns:sch="{SCH}"><sch:rule context="o:line">'
        f'<sch:assert id="B" test="@q > 1">b</sch:assert></sch:rule></sch:pattern>',
    )
    changed = load_schematron(path, cache_dir=cache)
    assert not changed.from_cache and [a.id for a in changed.assertions] == ["B"]
    rules = SaxonRules()
    rules.add(load_schematron(path, cache_dir=cache))
    assert [f.location for f in rules.run(ORDER)] == ["/o:order[1]/o:line[2]"]


def test_a_rule_set_that_does_not_compile_is_not_cached(tmp_path):
    cache = tmp_path / "cache"
    path = write(
        tmp_path / "rules.sch",
        schema('<sch:pattern><sch:rule context="*"><sch:assert test="(">x</sch:assert></sch:rule></sch:pattern>'),
    )
    for _ in range(2):
        with pytest.raises(SchematronError):
            load_schematron(path, cache_dir=cache)
    assert not list(cache.glob("*.json"))


# --------------------------------------------------------------------------- locations


def test_locations_find_their_element_in_the_parsed_document(tmp_path):
    rules = engine(
        tmp_path,
        '<sch:pattern><sch:rule context="o:line/@q"><sch:assert test=". > 0">x</sch:assert></sch:rule></sch:pattern>',
    )
    root = etree.fromstring(ORDER)
    (found,) = rules.run(ORDER)
    assert locate(root, found.path) is root[1]
    assert locate(root, "/Q{urn:o}order[1]/Q{urn:o}line[9]") is None


# --------------------------------------------------------------------------- agreement with XPath 1.0

SIMPLE_ASSERTS = [
    "@q > 0",
    "@q <= 10 or @kind = 'bulk'",
    "string-length(@code) = 3",
    "not(@kind) or @kind = 'bulk' or @kind = 'unit'",
    "contains(., 'x') = false()",
    "starts-with(@code, 'A')",
    "number(@q) * number(@price) = number(@amount)",
    "count(../o:line) > 1",
    "count(../o:line[@q = 0]) < 2",
    "normalize-space(.) != ''",
    "@code = ../o:line[1]/@code",
    "not(@price < 0)",
]

_values = st.one_of(st.integers(-5, 60).map(str), st.sampled_from(["", "x", "1.5", "ABC", "A1", " 7 ", "NaN"]))
_lines = st.lists(
    st.fixed_dictionaries(
        {
            "q": _values,
            "price": _values,
            "amount": _values,
            "code": _values,
            "kind": st.sampled_from([None, "bulk", "unit", "other"]),
            "text": st.sampled_from(["", " ", "box", "xy", "text x"]),
        }
    ),
    min_size=1,
    max_size=6,
)


def _document(lines: list[dict]) -> str:
    out = []
    for line in lines:
        attrs = " ".join(f'{k}="{v}"' for k, v in line.items() if k != "text" and v is not None)
        out.append(f"<o:line {attrs}>{line['text']}</o:line>")
    return f'<o:order xmlns:o="urn:o">{"".join(out)}</o:order>'


@pytest.fixture(scope="module")
def simple_rules(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("simple")
    asserts = "\n".join(
        f'<sch:assert id="A{i}" test="{t.replace("<", "&lt;")}">{i}</sch:assert>' for i, t in enumerate(SIMPLE_ASSERTS)
    )
    return engine(tmp, f'<sch:pattern><sch:rule context="o:line">{asserts}</sch:rule></sch:pattern>', binding="xslt")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_lines)
def test_simple_asserts_agree_with_lxml_xpath_1(simple_rules, lines):
    text = _document(lines)
    root = etree.fromstring(text)
    expected = set()
    for position, line in enumerate(root, 1):
        for i, test in enumerate(SIMPLE_ASSERTS):
            if not line.xpath(f"boolean({test})", namespaces={"o": "urn:o"}):
                expected.add((f"A{i}", f"/o:order[1]/o:line[{position}]"))
    got = {(f.assertion.id, f.location) for f in simple_rules.run(document_text(root))}
    assert got == expected
