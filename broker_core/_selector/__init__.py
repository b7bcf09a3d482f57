"""JMS message selectors: compile once, evaluate on the hot path.

:func:`compile_selector` parses a selector (JMS 1.1/2.0 section 3.8.1, plus
ActiveMQ's ``XPATH '<expr>'``) with lark's LALR parser (``selector.lark``),
checks it (an :class:`InvalidSelectorError` quotes the line with a caret) and
translates it into one Python function: no tree is walked per message.

The stages, each a module, in the order a selector goes through them:

* :mod:`.grammar`: the LALR parser of ``selector.lark``;
* :mod:`.error_text`: where in the selector, and what was expected, for the
  messages of :class:`InvalidSelectorError`;
* :mod:`.checker`: the parse tree to a typed, checked expression tree;
* :mod:`.xpath`: ``XPATH '<expr>'``, compiled once and evaluated on the body;
* :mod:`.codegen`: the checked tree to the Python source of one function;
* :mod:`.runtime`: the helpers that source calls (three-valued logic,
  comparisons of unlike types, string numbers);
* :mod:`.selector`: :class:`Selector` and :func:`compile_selector`, which
  run the stages.

Semantics: SQL three-valued (``None`` is UNKNOWN; only TRUE matches), and
where the specification leaves room:

* NULL (absent property, null header) makes comparisons, arithmetic, IN and
  LIKE UNKNOWN. Numbers are ``int``/``float`` and their narrow subclasses,
  never ``bool``; a value of another type is like no type, not even its own.
* Two non-NULL values of unlike types compare FALSE whatever the operator
  (section 3.8.1.2); ordering two strings or booleans is UNKNOWN.
* BETWEEN and IN expand as the specification defines them, so a non-number
  is neither BETWEEN nor NOT BETWEEN, and a non-string is NOT IN and NOT LIKE
  anything (ActiveMQ makes IN UNKNOWN there; we keep the stated equivalence).
* Arithmetic on a non-number, and division by zero, is NULL; ``/`` of two
  integers truncates toward zero (Java).
* A message marked with :data:`STRING_NUMBERS_PROPERTY` (STOMP sends only
  strings) has decimal string properties read as numbers where one is wanted.
* ``XPATH`` is XPath's ``boolean()`` of the XML body (FALSE: not XML).
"""

from .runtime import STRING_NUMBERS_PROPERTY, string_number
from .selector import Selector, compile_selector

__all__ = ["Selector", "compile_selector", "STRING_NUMBERS_PROPERTY", "string_number"]
