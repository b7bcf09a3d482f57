"""Parsing and validating in one pass for larger bodies: the document is fed to a validating parser in
slices, so that an invalid document is known before all of it is parsed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lxml import etree

from gateway.intake.encodings import _not_well_formed
from gateway.intake.limits import DEFAULT_LIMITS, IntakeLimits
from gateway.intake.parse import ExternalLoadRefusedError, _finish, _parser, _prepare, parse_document_text
from gateway.intake.scan import _ATTRIBUTE, _DOCTYPE_MESSAGE, _PROLOG, _TAG_NAME, _security

# --------------------------------------------------------------------------- validating while parsing

#: Bodies larger than this are validated while being fed to the parser a chunk at a time, so that
#: the validation can stop once ``max_errors`` errors are in; smaller ones in one call (a push
#: parse costs about half as much again as a parse from memory).
FEED_OVER_BYTES = 1024 * 1024
_FEED_CHUNK = 256 * 1024


@dataclass(slots=True)
class Validated:
    """What :func:`parse_and_validate` made of a body.

    ``root`` is the tree (None when the document is invalid: the validating parse keeps none);
    ``schema`` what :func:`parse_and_validate`'s *schema_for* chose (None: not validated);
    ``errors`` libxml2's validation errors (empty when valid), at most ``max_errors`` of them,
    ``complete`` False when the validation stopped there.
    """

    root: etree._Element | None
    text: str | None
    schema: Any = None
    errors: list[Any] = field(default_factory=list)
    complete: bool = True


def parse_and_validate(
    data: bytes,
    schema_for: Callable[[str], tuple[Any, etree.XMLSchema] | None],
    limits: IntakeLimits = DEFAULT_LIMITS,
    *,
    declared_charset: str | None = None,
    max_errors: int = 1000,
) -> Validated:
    """:func:`parse_document_text` and XSD validation in one pass (libxml2's streaming validator).

    *schema_for* gets the root element's Clark name, read from the root's start tag, and returns a
    key and the schema to validate against, or None to parse without validating. Each error costs
    the same whatever the document's shape (a validation of the tree walks the preceding siblings
    of every element in error), and at most about *max_errors* are collected: bodies over
    :data:`FEED_OVER_BYTES` are fed a chunk at a time and the validation stops once that many are in.
    Raises what :func:`parse_document` raises for a document that is not well-formed or over a limit.
    """
    decoded, tree_checks = _prepare(data, limits, declared_charset)
    root_name = _root_name(decoded.text)
    chosen = schema_for(root_name) if root_name is not None else None
    if chosen is None:
        root, _ = parse_document_text(data, limits, declared_charset=declared_charset)
        return Validated(root, decoded.text if decoded.utf8 else None)
    key, schema = chosen
    parser = _parser(decoded.override, schema)
    text = decoded.text if decoded.utf8 else None

    def redo() -> object:
        return parse_document_text(data, limits, declared_charset=declared_charset)

    try:
        if len(data) <= FEED_OVER_BYTES:
            try:
                root = etree.fromstring(data, parser)
            except etree.XMLSyntaxError:
                log = list(parser.error_log)
                return _invalid_or_raise(log, key, text, redo, complete=True)
        else:
            stopped = False
            try:
                for start in range(0, len(data), _FEED_CHUNK):
                    parser.feed(data[start : start + _FEED_CHUNK])
                    if len(parser.feed_error_log) >= max_errors:
                        stopped = True
                        break
                log = list(parser.feed_error_log)
            except etree.XMLSyntaxError:
                log = list(parser.feed_error_log)
                _close_quietly(parser)
                return _invalid_or_raise(log, key, text, redo, complete=True)
            if stopped:
                _close_quietly(parser)
                return _invalid_or_raise(log, key, text, redo, complete=False)
            try:
                root = parser.close()
            except etree.XMLSyntaxError:
                return _invalid_or_raise(list(parser.feed_error_log), key, text, redo, complete=True)
    except ExternalLoadRefusedError:  # unreachable unless the prolog scan was fooled
        raise _security(_DOCTYPE_MESSAGE) from None
    _finish(root, decoded, limits, tree_checks)
    return Validated(root, text, key)


def _close_quietly(parser: etree.XMLParser) -> None:
    try:
        parser.close()  # ends the unfinished document, so the parser starts afresh next time
    except etree.XMLSyntaxError:
        pass


def _invalid_or_raise(
    log: list[Any], key: Any, text: str | None, redo: Callable[[], object], *, complete: bool
) -> Validated:
    """A document the validating parse refused: invalid (returns its validation errors, at most the
    first max_errors) or not well-formed, when *redo* (the plain parse, which libxml2's well-formedness
    errors come from intact) raises what :func:`parse_document` raises."""
    schema_errors = [e for e in log if e.domain == _SCHEMA_DOMAIN]
    if not schema_errors or (
        complete and any(e.domain != _SCHEMA_DOMAIN and e.level >= etree.ErrorLevels.ERROR for e in log)
    ):
        redo()
    if not schema_errors:  # pragma: no cover - the plain parse raised
        raise _not_well_formed("The document is not well-formed XML.")
    return Validated(None, text, key, schema_errors, complete)


_SCHEMA_DOMAIN = etree.ErrorDomains.SCHEMASV


def _root_name(text: str) -> str | None:
    """The Clark name of the root element as its start tag writes it (None when it cannot tell: a
    reference in a namespace URI, a prefix declared nowhere on the root)."""
    start = _PROLOG.match(text).end()  # type: ignore[union-attr]  # always matches
    m = _TAG_NAME.match(text, start)
    if m is None:
        return None
    qname = m.group(1)
    prefix, _, local = qname.rpartition(":")
    wanted = f"xmlns:{prefix}" if prefix else "xmlns"
    pos = m.end()
    while (a := _ATTRIBUTE.match(text, pos)) is not None:
        pos = a.end()
        if a.group(1) == wanted:
            uri = a.group(2) if a.group(2) is not None else a.group(3)
            if "&" in uri:
                return None
            return f"{{{uri}}}{local}" if uri else local
    return None if prefix else local
