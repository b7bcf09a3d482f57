"""Schema validation of parsed documents.

:class:`SchemaRegistry` holds the XSDs the gateway validates against, keyed by a schema name
(``"ubl-2.1/Order"``) and by the Clark name of the root element each one declares. Compilation happens once,
from local files only: lxml (libxml2) compiles each XSD 1.0 schema for the fast path, through
:class:`LocalSchemaResolver`, which serves files under the allowed directories and refuses anything else;
xmlschema builds the same schemas for rich error reports, for XSD 1.1 schemas (validated with xmlschema
only) and for :meth:`SchemaRegistry.check_path`, with no remote URL, ``defuse="always"`` and an opener that
serves only ``file:`` URLs under the allowed directories. Schemas registered in one *group* are built as one
bundle, so that the large UBL common components are built once. :meth:`SchemaRegistry.compile` does both
at startup for the configured names; anything else is compiled on first use (thread-safe).

:meth:`SchemaRegistry.validate` is libxml2's validation; only when it fails are the errors collected, each
with a line, a column, the element path with the document's prefixes and positions
(``/Order/cac:OrderLine[2]/cbc:Quantity``) and a bounded message, at most ``max_errors`` of them.

The gateway does not run xmlschema on a request in its own process: its cost grows faster than the document,
and it holds the interpreter lock while it runs. :meth:`SchemaRegistry.explain` (the full report) runs in a
helper process under a time budget (:mod:`gateway.intake.explainer`); the serving process falls back to
:meth:`SchemaRegistry.libxml2_error` (small documents: libxml2's errors of the tree, located) or
:meth:`SchemaRegistry.streamed_error` (a validation made while parsing: messages without positions).
"""

from __future__ import annotations

from gateway.intake.locations import element_path
from gateway.intake.schema_loading import UBL_NAMESPACES, XSD_NS, LocalSchemaResolver
from gateway.intake.schema_registry import SchemaRegistry

__all__ = [
    "LocalSchemaResolver",
    "SchemaRegistry",
    "UBL_NAMESPACES",
    "XSD_NS",
    "element_path",
]
