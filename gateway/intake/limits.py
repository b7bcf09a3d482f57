"""What one document may hold (:class:`IntakeLimits`): its size, depth, names, texts, attributes and
namespaces, each bounded so that whoever sends the document cannot make its intake expensive."""

from __future__ import annotations

from dataclasses import dataclass, field

#: The nesting depth libxml2 allows when ``XML_PARSE_HUGE`` is off (always, here).
LIBXML2_MAX_DEPTH = 256

#: What :func:`check_media_type` accepts (for messages and docs).
ACCEPTED_MEDIA_TYPES = ("application/xml", "text/xml", "application/*+xml")


@dataclass(frozen=True, slots=True)
class IntakeLimits:
    """Limits applied to one request body (docs/limits.md lists them for operators).

    ``max_bytes`` (10 MiB): the largest body. ``max_depth`` (256): the deepest nesting, at most libxml2's own
    limit without ``huge_tree``. ``max_elements`` (500,000): bounds the tree's memory (an lxml element costs
    about 120 bytes) while a real UBL document at the size limit still passes; a flood of ``<a/>`` is refused
    before any tree is built.

    The others follow the JDK's XML processing limits, so that what this gateway accepts a Java back end parses
    too: ``max_attributes`` (200, ``jdk.xml.elementAttributeLimit``, namespace declarations not counted);
    ``max_namespaces_per_element`` (100) and ``max_namespaces_per_document`` (100,000): each declaration costs
    libxml2 memory and widens the in-scope namespaces below it, yet generators copying the UBL examples declare
    one again in every invoice line; ``max_name_length`` (1,000, ``jdk.xml.maxXMLNameLimit``) for names and
    namespace URIs; ``max_text_length`` (4 MiB of characters) for one text or attribute value, room for an
    embedded attachment of about 3 MB. DTDs, and so entities, are refused outright.
    """

    max_bytes: int = 10 * 1024 * 1024
    max_depth: int = LIBXML2_MAX_DEPTH
    max_elements: int = 500_000
    max_attributes: int = 200
    max_namespaces_per_element: int = 100
    max_namespaces_per_document: int = 100_000
    max_name_length: int = 1_000
    max_text_length: int = 4 * 1024 * 1024
    #: the shortest stretch from a start tag's "<" to the next "<" that can hold a tag over a limit
    tag_gap: int = field(init=False, repr=False, compare=False, hash=False, default=0)

    def __post_init__(self) -> None:
        for name in LIMIT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"IntakeLimits.{name} must be a positive integer, not {value!r}")
        if self.max_depth > LIBXML2_MAX_DEPTH:
            raise ValueError(
                f"IntakeLimits.max_depth may not exceed {LIBXML2_MAX_DEPTH} (libxml2's limit without huge_tree)"
            )
        object.__setattr__(
            self,
            "tag_gap",
            min(
                self.max_name_length + 2,  # "<" and a longer name
                5 * self.max_attributes + 7,  # "<a" and one attribute more, ' b=""' each at least
                11 * self.max_namespaces_per_element + 11,  # ' xmlns=""' once, ' xmlns:p=""' for the others
                self.max_text_length + 1,  # "<" ... ">" and a longer text
            ),
        )


#: The fields of :class:`IntakeLimits`, in order.
LIMIT_FIELDS = (
    "max_bytes",
    "max_depth",
    "max_elements",
    "max_attributes",
    "max_namespaces_per_element",
    "max_namespaces_per_document",
    "max_name_length",
    "max_text_length",
)


DEFAULT_LIMITS = IntakeLimits()
