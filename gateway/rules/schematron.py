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

from gateway.rules.cache import default_cache_dir, load_schematron
from gateway.rules.compiled import Assertion, CompiledSchematron, Finding, SchematronError, severity_of
from gateway.rules.compiler import compile_schematron
from gateway.rules.saxon import SaxonRules, document_text, document_utf8, locate, parse_output

__all__ = [
    "Assertion",
    "CompiledSchematron",
    "Finding",
    "SaxonRules",
    "SchematronError",
    "compile_schematron",
    "default_cache_dir",
    "document_text",
    "document_utf8",
    "load_schematron",
    "locate",
    "parse_output",
    "severity_of",
]
