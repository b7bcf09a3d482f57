"""Plain words for xmlschema's validation errors: what a partner reads in a schema-invalid document's ``errors``.

xmlschema's reasons are written for Python programmers: they quote Python
classes (``Invalid datetime string 'yesterday' for <class
'elementpath.datatypes.datetime.Date10'>``), reprs (``Decimal('100')``,
``XsdElement(ref='cbc:ID', occurs=[1, 1])``) and Python's own messages
(``invalid literal for int() with base 10``). :func:`plain_message` rewrites
an error from its structure (the XSD component that failed, the value, the
element) into a sentence that names the element, the value (clipped) and what
the schema expects in XSD terms::

    cbc:IssueDate: 'yesterday' is not a valid date (xs:date, e.g. 2024-03-14)

An error of a kind it does not know keeps xmlschema's reason only when that
reads as plain words, else says the element does not match its schema.
"""

from __future__ import annotations

import re
from typing import Any

from lxml import etree
from xmlschema.validators import (
    XsdAssertionFacet,
    XsdAttribute,
    XsdAttributeGroup,
    XsdElement,
    XsdEnumerationFacets,
    XsdExplicitTimezoneFacet,
    XsdFacet,
    XsdFractionDigitsFacet,
    XsdLengthFacet,
    XsdMaxExclusiveFacet,
    XsdMaxInclusiveFacet,
    XsdMaxLengthFacet,
    XsdMinExclusiveFacet,
    XsdMinInclusiveFacet,
    XsdMinLengthFacet,
    XsdPatternFacets,
    XsdSimpleType,
    XsdTotalDigitsFacet,
    XsdUnion,
    XsdWhiteSpaceFacet,
)
from xmlschema.validators.exceptions import XMLSchemaChildrenValidationError

__all__ = ["plain_message"]

_XSD = "{http://www.w3.org/2001/XMLSchema}"
#: Longest value quoted in a message (the rest is cut: the message must still say what is expected).
VALUE_CHARS = 40

#: XSD built-in type -> (what a value of it is, how one looks), for "'x' is not a valid <what> (xs:<type><looks>)".
_TYPES: dict[str, tuple[str, str]] = {
    "date": ("date", ", e.g. 2024-03-14"),
    "time": ("time", ", e.g. 14:30:00"),
    "dateTime": ("date and time", ", e.g. 2024-03-14T14:30:00"),
    "duration": ("duration", ", e.g. P1DT2H"),
    "gYear": ("year", ", e.g. 2024"),
    "gYearMonth": ("year and month", ", e.g. 2024-03"),
    "gMonth": ("month", ", e.g. --03"),
    "gMonthDay": ("month and day", ", e.g. --03-14"),
    "gDay": ("day of the month", ", e.g. ---14"),
    "decimal": ("decimal number", ", e.g. 1234.56"),
    "integer": ("whole number", ", e.g. 42"),
    "nonNegativeInteger": ("whole number", ": 0 or more"),
    "positiveInteger": ("whole number", ": 1 or more"),
    "nonPositiveInteger": ("whole number", ": 0 or less"),
    "negativeInteger": ("whole number", ": -1 or less"),
    "long": ("whole number", " from -9223372036854775808 to 9223372036854775807"),
    "int": ("whole number", " from -2147483648 to 2147483647"),
    "short": ("whole number", " from -32768 to 32767"),
    "byte": ("whole number", " from -128 to 127"),
    "unsignedLong": ("whole number", " from 0 to 18446744073709551615"),
    "unsignedInt": ("whole number", " from 0 to 4294967295"),
    "unsignedShort": ("whole number", " from 0 to 65535"),
    "unsignedByte": ("whole number", " from 0 to 255"),
    "double": ("number", ", e.g. 1.5 or 1.5E3"),
    "float": ("number", ", e.g. 1.5 or 1.5E3"),
    "boolean": ("boolean", ": true, false, 1 or 0"),
    "language": ("language code", ", e.g. en or en-GB"),
    "anyURI": ("URI", ", e.g. https://example.com/codes"),
    "base64Binary": ("base64 text", ", e.g. SGVsbG8="),
    "hexBinary": ("hexadecimal text", ", e.g. 0FB7"),
    "QName": ("qualified name", ", e.g. cbc:ID"),
    "NCName": ("name without a colon", ", e.g. Item-1"),
    "Name": ("XML name", ", e.g. Item-1"),
    "ID": ("identifier (an XML name)", ", e.g. Item-1"),
    "IDREF": ("reference to an identifier (an XML name)", ", e.g. Item-1"),
    "NMTOKEN": ("name token", ", e.g. A-1"),
    "token": ("token", ": text without leading, trailing or repeated spaces"),
    "normalizedString": ("text", ": without tabs or line breaks"),
    "string": ("text", ""),
}

#: The range rules xmlschema applies to the integer types (its reason's tail) -> the type.
_RANGES = {
    "-128 <= x < 128": "byte",
    "-2^15 <= x < 2^15": "short",
    "-2^31 <= x < 2^31": "int",
    "-2^63 <= x < 2^63": "long",
    "0 <= x < 256": "unsignedByte",
    "0 <= x < 2^16": "unsignedShort",
    "0 <= x < 2^32": "unsignedInt",
    "0 <= x < 2^64": "unsignedLong",
    "negative": "negativeInteger",
    "positive": "positiveInteger",
    "non positive": "nonPositiveInteger",
    "non negative": "nonNegativeInteger",
}

#: Why a date or time is out of range, as the datetime parser says it -> plain words.
_DATE_DETAILS = (
    (re.compile(r"^(year|month|day|hour|minute|second) must be in (\d+)\.\.(\d+)"), "the {0} must be from {1} to {2}"),
    (re.compile(r"^day is out of range for month"), "that month has no such day"),
    (re.compile(r"^year '(-?\d+)' is an illegal value"), "there is no year {0}"),
)

#: Reasons about an element's content -> what the element must be (after "<element> ").
_ELEMENT_REASONS = (
    (re.compile(r"simple content element can't have child elements"), "must hold a value only, not child elements"),
    (re.compile(r"character data is not allowed because content is empty"), "must be empty (no text)"),
    (re.compile(r"character data between child elements not allowed"), "must not have text between its child elements"),
    (re.compile(r"element is not nillable"), "cannot be nil (xsi:nil is not allowed for it)"),
    (re.compile(r"xsi:nil attribute must have a boolean value"), "has an xsi:nil that is not true or false"),
    (
        re.compile(r"xsi:nil='true' but the element (is not empty|has a fixed value)"),
        "has xsi:nil='true', so it must be empty",
    ),
    (re.compile(r"abstract"), "is abstract in the schema: use one of the elements or types that stand for it"),
    (re.compile(r"blocked"), "uses a substitution or type that the schema blocks here"),
)

#: What must never reach a partner: Python types, reprs, and the libraries' names.
_NOT_PLAIN = re.compile(
    r"class '|<[A-Za-z_]|[A-Za-z_]\w*\(|[\[{(]['\"]|\bDecimal\b|elementpath|xmlschema|\bXsd|0x[0-9a-fA-F]{4,}|Traceback"
)
_ATTRIBUTE = re.compile(r"^attribute (\S+?)=")


def plain_message(error: Any) -> str:
    """A sentence saying what is wrong, for one xmlschema validation *error*."""
    element = _element(getattr(error, "elem", None))
    subject = _name(element) if element is not None else "The document"
    reason = str(getattr(error, "reason", None) or "")
    if isinstance(error, XMLSchemaChildrenValidationError):
        return _children(error, element, subject)
    validator = getattr(error, "validator", None)
    attribute = None
    m = _ATTRIBUTE.match(reason)
    if m:
        attribute = m.group(1)
        reason = reason[m.end() :].split(": ", 1)[-1]
    if attribute is not None:
        subject = f"{subject}/@{attribute}"
    value = _value(error, element, attribute)

    if isinstance(validator, XsdAttributeGroup):
        return _attributes(validator, error, subject, reason, element)
    if isinstance(validator, XsdAttribute):
        name = _attribute_name(getattr(validator, "name", None) or "", element)
        fixed = getattr(validator, "fixed", None)
        if fixed is not None:
            return f"{subject}/@{name} must be {_quote(str(fixed))}."
    if isinstance(validator, XsdElement):
        fixed = getattr(validator, "fixed", None)
        if fixed is not None and "fixed" in reason:
            return f"{subject} must be {_quote(str(fixed))}."
    if isinstance(validator, XsdFacet | XsdPatternFacets | XsdEnumerationFacets):
        return _facet(validator, subject, value, reason)
    if isinstance(validator, XsdSimpleType):
        return _not_of_type(subject, value, _type_names(validator), reason)
    if callable(validator) and not isinstance(validator, type):  # xmlschema's integer range checks
        tail = reason.removeprefix("value must be ").strip()
        if tail in _RANGES:
            return _not_of_type(subject, value, [_RANGES[tail]], "")
    named = re.search(r"\bxs:(\w+)", reason)  # "invalid value 'x' for xs:decimal", "... is not an xs:duration value"
    if named and named.group(1) in _TYPES:
        return _not_of_type(subject, value, [named.group(1)], "")
    if getattr(validator, "path", None) and "assert" in reason:  # XSD 1.1 xs:assert
        return f"{subject} does not satisfy the schema's rule {_clip(str(validator.path), 120)} (xs:assert)."
    for pattern, words in _ELEMENT_REASONS:
        if pattern.search(reason):
            return f"{subject} {words}."
    if reason and not _NOT_PLAIN.search(reason):
        return f"{subject}: {reason.rstrip('.')}."
    return f"{subject} does not match its schema."


# --------------------------------------------------------------------------- kinds of error


def _not_of_type(subject: str, value: str | None, types: list[str], reason: str) -> str:
    if not types:
        return f"{subject}: {_quote(value or '')} is not a valid value for its schema type."
    nouns = " or ".join(dict.fromkeys(_TYPES.get(t, ("value", ""))[0] for t in types))
    if len(types) == 1:
        expected = f"{nouns} ({_type_and_example(types[0])})"
    else:
        expected = f"{nouns} ({' or '.join('xs:' + t for t in types)})"
    detail = ""
    for pattern, words in _DATE_DETAILS:
        m = pattern.search(reason)
        if m:
            detail = "; " + words.format(*m.groups())
            break
    if value is None or not value.strip(" \t\r\n"):  # XML's white space (a no-break space is a character)
        return f"{subject} is empty but must hold a valid {expected}."
    return f"{subject}: {_quote(value)} is not a valid {expected}{detail}."


def _type_and_example(name: str) -> str:
    return f"xs:{name}{_TYPES.get(name, ('', ''))[1]}"


def _facet(facet: Any, subject: str, value: str | None, reason: str) -> str:
    owner = getattr(facet, "parent", None)
    base = _type_names(owner) if owner is not None else []
    if _is_builtin(owner):  # the built-in type's own lexical rule (xs:double's, xs:language's pattern)
        return _not_of_type(subject, value, base, reason)
    shown = _quote(value or "")
    label = _type_label(owner, base)
    if isinstance(facet, XsdEnumerationFacets):
        allowed = [str(v) for v in (getattr(facet, "enumeration", None) or [])]
        listed = ", ".join(_clip(v, 30) for v in allowed[:12])
        if len(allowed) > 12:
            listed += f" and {len(allowed) - 12} more"
        return f"{subject}: {shown} is not one of the allowed values ({listed}){label}."
    if isinstance(facet, XsdPatternFacets):
        patterns = " or ".join(_clip(str(p), 80) for p in (getattr(facet, "regexps", None) or []))
        return f"{subject}: {shown} does not have the required form (pattern {patterns}){label}."
    limit = getattr(facet, "value", None)
    length = len(value or "")
    checks: list[tuple[type, str]] = [
        (XsdLengthFacet, f"must be exactly {limit} characters long, not {length}"),
        (XsdMinLengthFacet, f"is too short: at least {limit} characters, not {length}"),
        (XsdMaxLengthFacet, f"is too long: at most {limit} characters, not {length}"),
        (XsdMinInclusiveFacet, f"is below the minimum {limit}"),
        (XsdMinExclusiveFacet, f"must be greater than {limit}"),
        (XsdMaxInclusiveFacet, f"is above the maximum {limit}"),
        (XsdMaxExclusiveFacet, f"must be less than {limit}"),
        (XsdTotalDigitsFacet, f"has too many digits: at most {limit}"),
        (XsdFractionDigitsFacet, f"has too many digits after the decimal point: at most {limit}"),
    ]
    for kind, words in checks:
        if isinstance(facet, kind):
            return f"{subject}: {shown} {words}{label}."
    if isinstance(facet, XsdWhiteSpaceFacet):
        words = "tabs or line breaks" if "tabs" in reason else "leading, trailing or repeated spaces"
        return f"{subject}: {shown} must not contain {words}{label}."
    if isinstance(facet, XsdExplicitTimezoneFacet):
        if limit == "required":
            return f"{subject}: {shown} needs a time zone (e.g. Z or +01:00){label}."
        return f"{subject}: {shown} must not have a time zone{label}."
    if isinstance(facet, XsdAssertionFacet):
        return f"{subject}: {shown} does not satisfy the rule {_clip(str(getattr(facet, 'path', '')), 120)}{label}."
    return f"{subject}: {shown} is not allowed by its schema type{label}."


def _type_label(owner: Any, base: list[str]) -> str:
    name = getattr(owner, "local_name", None) or None
    based = f"xs:{base[0]}" if base else None
    if name and based:
        return f" (type {name}, based on {based})"
    if based:
        return f" (based on {based})"
    return ""


def _attributes(group: Any, error: Any, subject: str, reason: str, element: etree._Element | None) -> str:
    given = error.obj if isinstance(error.obj, dict) else {}
    m = re.search(r"missing required attribute '([^']+)'", reason)
    if m or "missing" in reason:
        names = (
            [m.group(1)]
            if m
            else [
                str(name)
                for name, attr in group.items()
                if getattr(attr, "use", None) == "required" and name not in given
            ]
        )
        if names:
            listed = ", ".join(_attribute_name(n, element) for n in names)
            return f"{subject} lacks its required attribute {listed}."
    m = re.search(r"'([^']+)' attribute not allowed", reason)
    if m or "not allowed" in reason:
        names = [m.group(1)] if m else [str(name) for name in given if name not in group]
        if names:
            return f"{subject} does not allow the attribute {', '.join(_attribute_name(n, element) for n in names)}."
    return f"{subject} has attributes its schema does not allow."


def _children(error: Any, parent: etree._Element | None, subject: str) -> str:
    expected = _expected(error, parent)
    child = _element(getattr(error, "invalid_child", None))
    particle = getattr(error, "particle", None)
    occurs = getattr(error, "occurs", 0) or 0
    if child is None:  # the content ended too early
        return f"{subject} is incomplete: {expected or 'a required child element'} is missing."
    name = _name(child)
    max_occurs = getattr(particle, "max_occurs", None)
    if (
        isinstance(particle, XsdElement)
        and max_occurs is not None
        and (occurs > max_occurs or getattr(particle, "name", None) == child.tag)
    ):
        return f"{name} appears too often in {subject}: at most {max_occurs} time{'s' if max_occurs != 1 else ''}."
    if expected:
        return f"{name} is not allowed here in {subject}; expected {expected}."
    return f"{name} is not allowed here in {subject} (nothing, or nothing of that name, may come at this point)."


def _expected(error: Any, parent: etree._Element | None) -> str:
    names = []
    for item in getattr(error, "expected", None) or []:
        qname = getattr(item, "name", None)
        if qname:
            names.append(_qname(qname, parent))
        else:  # a wildcard (xs:any)
            spaces = [str(ns) for ns in getattr(item, "namespace", None) or []]
            names.append(
                "an element of namespace " + " or ".join(_clip(ns, 80) for ns in spaces)
                if spaces
                else "another element"
            )
    if not names:
        return ""
    if len(names) == 1:
        return names[0]
    listed = ", ".join(names[:6]) + (f" ({len(names) - 6} more)" if len(names) > 6 else "")
    return f"one of {listed}"


# --------------------------------------------------------------------------- names and values


def _element(value: Any) -> etree._Element | None:
    return value if isinstance(value, etree._Element) else None


def _name(element: etree._Element) -> str:
    """The element's name with the document's own prefix."""
    qname = etree.QName(element)
    return f"{element.prefix}:{qname.localname}" if element.prefix else qname.localname


def _qname(clark: str, context: etree._Element | None) -> str:
    """A Clark name written with the context document's prefixes (else its local name)."""
    if not clark.startswith("{"):
        return clark
    namespace, local = clark[1:].split("}", 1)
    if context is not None:
        for prefix, uri in context.nsmap.items():
            if uri == namespace:
                return f"{prefix}:{local}" if prefix else local
    return local


def _attribute_name(name: str, element: etree._Element | None) -> str:
    return _qname(name, element)


def _value(error: Any, element: etree._Element | None, attribute: str | None) -> str | None:
    obj = getattr(error, "obj", None)
    if isinstance(obj, str):
        text = element.text or "" if element is not None and attribute is None and not len(element) else None
        # xmlschema strips and collapses the value by Python's white space (no-break spaces too): quote it as sent
        return text if text is not None and obj in ("", " ".join(text.split())) else obj
    if element is not None:
        if attribute is not None:
            for name, text in element.attrib.items():
                if _qname(str(name), element) == attribute:
                    return str(text)
        elif len(element) == 0:
            return element.text or ""
    return None if obj is None or isinstance(obj, etree._Element | dict) else str(obj)


def _quote(value: str) -> str:
    """*value* in quotes, clipped, its control characters written as escapes (a message is one line)."""
    text = _clip(value, VALUE_CHARS)
    text = "".join(ch if ch >= " " else f"\\x{ord(ch):02x}" for ch in text.replace("\n", "\\n").replace("\t", "\\t"))
    return f"'{text}'"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


# --------------------------------------------------------------------------- types


def _is_builtin(xsd_type: Any) -> bool:
    return str(getattr(xsd_type, "name", "") or "").startswith(_XSD)


def _type_names(xsd_type: Any) -> list[str]:
    """The XSD built-in types behind *xsd_type* (several for a union), local names."""
    if isinstance(xsd_type, XsdUnion):
        out: list[str] = []
        for member in getattr(xsd_type, "member_types", []):
            out += _type_names(member)
        return list(dict.fromkeys(out))
    item = getattr(xsd_type, "item_type", None)  # a list type: the error is about one item
    if item is not None:
        return _type_names(item)
    seen = 0
    current = xsd_type
    while current is not None and seen < 50:
        if _is_builtin(current):
            return [str(current.name)[len(_XSD) :]]
        current = getattr(current, "base_type", None)
        seen += 1
    primitive = getattr(xsd_type, "primitive_type", None)
    return [str(primitive.name)[len(_XSD) :]] if _is_builtin(primitive) else []
