"""ActiveMQ's ``XPATH '<expr>'`` selector: the expression is compiled and
tried once when the selector is checked, then evaluated as XPath's
``boolean()`` of each message's XML body (FALSE when the body is not XML)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lxml import etree

from .error_text import _shorten

__all__ = ["compile_xpath"]


def compile_xpath(expr: str, namespaces: Mapping[str, str] | None, fail: Callable[[str], Exception]) -> etree.XPath:
    """*expr* compiled with *namespaces*; ``fail(what)`` gives the error raised when it does not compile,
    or names an unknown prefix, function or variable (found now rather than per message)."""
    try:
        xpath = etree.XPath(expr, namespaces=namespaces, smart_strings=False)
    except etree.XPathSyntaxError as exc:
        raise fail(f"invalid XPath expression {_shorten(expr)!r}: {exc}") from None
    except (etree.XPathError, TypeError, ValueError) as exc:
        raise fail(f"cannot compile XPath expression {_shorten(expr)!r}: {exc}") from None
    try:
        xpath(etree.Element("selector-check"))
    except etree.XPathError as exc:
        raise fail(f"cannot evaluate XPath expression {_shorten(expr)!r}: {exc}") from None
    return xpath


def _xpath(e: Any, xpath: Any) -> bool | None:
    try:
        root = e.xml_root()
    except Exception:
        return False
    if root is None:
        return False  # the body is not XML
    try:
        r = xpath(root)
    except Exception:
        return None
    if r is True or r is False:
        return r
    if isinstance(r, float):
        return r == r and r != 0.0
    if isinstance(r, (str, list)):
        return len(r) > 0
    return None  # pragma: no cover - XPath 1.0 has no other result types
