"""A compiled selector, and :func:`compile_selector`, which runs the stages:
parse (:mod:`.grammar`), check (:mod:`.checker`), generate (:mod:`.codegen`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lark.exceptions import UnexpectedInput

from .._errors import InvalidSelectorError
from .checker import _Checker
from .codegen import _Generator
from .error_text import _error, _syntax_error
from .grammar import _parser

__all__ = ["Selector", "compile_selector"]


class Selector:
    """A compiled message selector.

    ``text`` is the selector as given; ``source`` the generated Python (for
    debugging). :meth:`matches` is safe to call from several threads.
    """

    __slots__ = ("text", "source", "_test")

    def __init__(self, text: str, test: Callable[[Any], bool], source: str) -> None:
        self.text = text
        self.source = source
        self._test = test

    def matches(self, envelope: Any) -> bool:
        """True when the selector evaluates to TRUE for ``envelope``; False when
        it is FALSE or UNKNOWN. Never raises."""
        try:
            return self._test(envelope) is True
        except Exception:  # a malformed envelope must not break delivery
            return False

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str | None, xpath_namespaces: Mapping[str, str] | None = None) -> Selector | None:
    """Compile ``text`` into a :class:`Selector`; ``None`` when ``text`` is
    ``None``, empty or only white space (no selector: everything matches).

    ``xpath_namespaces`` maps prefixes to namespace URIs for ``XPATH``
    expressions. Raises :class:`InvalidSelectorError` for any invalid selector.
    """
    if text is None:
        return None
    if not isinstance(text, str):
        raise InvalidSelectorError(
            f"a selector must be a string, not {type(text).__name__}", selector=repr(text), line=0, column=0
        )
    if not text.strip():
        return None
    if xpath_namespaces is not None and not isinstance(xpath_namespaces, Mapping):
        raise InvalidSelectorError(
            f"xpath_namespaces must be a mapping of prefix to URI, not {type(xpath_namespaces).__name__}",
            selector=text,
            line=0,
            column=0,
        )
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc) from None
    try:
        node = _Checker(text, xpath_namespaces).selector(tree)
        source, namespace = _Generator().function(node)
        code = compile(source, "<selector>", "exec")
        exec(code, namespace)
    except InvalidSelectorError as exc:  # raised deep in the checker: drop its long traceback
        raise exc.with_traceback(None) from None
    except (RecursionError, MemoryError, SyntaxError) as exc:  # pragma: no cover - _MAX_DEPTH and hoisting prevent it
        raise _error(text, 0, "the selector is too deeply nested to compile") from exc
    return Selector(text, namespace["_selector"], source)
