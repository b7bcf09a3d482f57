"""Safe intake of XML request bodies: size, media type, encoding, parsing.

1. :func:`read_body`: the streamed body, refused (:class:`~gateway.errors.DocumentTooLargeError`) as soon as
   it passes ``max_bytes``.
2. :func:`check_media_type`: ``application/xml``, ``text/xml`` or ``application/*+xml``; returns the charset.
3. :func:`parse_document`: the bytes to an lxml tree, hardened.
   Encoding: the byte order mark, the XML declaration and the HTTP charset must agree, else
   :class:`~gateway.errors.NotWellFormedError`; the parser is told the encoding chosen, so that Python's
   check and libxml2 read the same text.
   No DTD: a DOCTYPE is refused before libxml2 sees the bytes, and the parser runs without entities, network
   or DTD loading, with a resolver that refuses every load. lxml's ``collect_ids=False`` is deliberately not
   used: with lxml 6.1 / libxml2 2.14 it makes libxml2 read external DTD subsets from local files despite
   ``load_dtd=False``.
   Limits (:class:`IntakeLimits`): the element count and the limits after the JDK's are checked on the text
   before any tree is built (:func:`_check_markup` jumps from "<" to "<" over stretches no over-long tag fits
   in); the depth beyond libxml2's own and what only the tree can tell are checked on it with XPath.
4. :func:`parse_and_validate` (the intake of larger bodies): the same, validating against the root element's
   schema while libxml2 parses, so that every error costs the same and their number is capped.

A pass over a long text goes a megabyte at a time and lxml parses without the interpreter lock, so no call
here holds the lock for long (see :mod:`gateway.exchange.stages`). What these functions put in an error is bounded
(:mod:`gateway.errors`) and never holds an entity expansion or the content of a file: none is ever loaded.
"""

from __future__ import annotations

from gateway.intake.body import read_body
from gateway.intake.encodings import SUPPORTED_ENCODINGS
from gateway.intake.limits import ACCEPTED_MEDIA_TYPES, DEFAULT_LIMITS, LIBXML2_MAX_DEPTH, LIMIT_FIELDS, IntakeLimits
from gateway.intake.media import check_media_type
from gateway.intake.parse import ExternalLoadRefusedError, parse_document, parse_document_text
from gateway.intake.validate import FEED_OVER_BYTES, Validated, parse_and_validate

__all__ = [
    "ACCEPTED_MEDIA_TYPES",
    "DEFAULT_LIMITS",
    "ExternalLoadRefusedError",
    "FEED_OVER_BYTES",
    "IntakeLimits",
    "LIBXML2_MAX_DEPTH",
    "LIMIT_FIELDS",
    "SUPPORTED_ENCODINGS",
    "Validated",
    "check_media_type",
    "parse_and_validate",
    "parse_document",
    "parse_document_text",
    "read_body",
]
