"""JMS message selectors: compile once, evaluate on the hot path.

:func:`compile_selector` parses a selector (JMS 1.1/2.0 section 3.8.1, plus
ActiveMQ's ``XPATH '<expr>'``) with lark's LALR parser (``selector.lark``),
checks it (an :class:`InvalidSelectorError` quotes the line with a caret) and
translates it into one Python function: no tree is walked per message.

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

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lxml import etree

from ._errors import InvalidSelectorError

__all__ = ["Selector", "compile_selector", "STRING_NUMBERS_PROPERTY", "string_number"]

#: A message whose boolean property of this name is true has its string
#: properties read as numbers where a selector wants a number (see the module doc).
STRING_NUMBERS_PROPERTY = "JMS_StringNumbers"


# ====================================================================== API


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


# ====================================================================== parsing

_GRAMMAR_FILE = Path(__file__).with_name("selector.lark")
_parser_instance: Lark | None = None
_parser_lock = threading.Lock()


def _parser() -> Lark:
    global _parser_instance
    parser = _parser_instance
    if parser is None:
        with _parser_lock:
            if _parser_instance is None:
                _parser_instance = Lark(
                    _GRAMMAR_FILE.read_text(encoding="utf-8"),
                    parser="lalr",
                    lexer="basic",
                    propagate_positions=True,
                    maybe_placeholders=True,
                )
            parser = _parser_instance
    return parser


# ---------------------------------------------------------------- error text

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_QUOTE_WIDTH = 100  # longest stretch of a selector line quoted in a message


def _locate(text: str, offset: int) -> tuple[int, int, str]:
    """(line, column, text of that line) of ``offset``; 1-based. Line breaks
    are CR LF, CR or LF, as in Java."""
    line, start = 1, 0
    for m in _LINE_BREAK.finditer(text, 0, offset):
        line, start = line + 1, m.end()
    m = _LINE_BREAK.search(text, start)
    return line, offset - start + 1, text[start : m.start() if m else len(text)]


def _error(text: str, offset: int, what: str) -> InvalidSelectorError:
    """``what`` at ``offset`` of ``text``, as an InvalidSelectorError whose
    message quotes the line with a caret under the offending character."""
    offset = max(0, min(offset, len(text)))
    line, column, line_text = _locate(text, offset)
    shown, caret = line_text, column - 1
    if len(line_text) > _QUOTE_WIDTH:  # quote a window around the problem
        lo = max(0, caret - _QUOTE_WIDTH // 2)
        hi = lo + _QUOTE_WIDTH
        shown = ("..." if lo else "") + line_text[lo:hi] + ("..." if hi < len(line_text) else "")
        caret = caret - lo + (3 if lo else 0)
    prefix = f"{what} at line {line}, column {column}: "
    pad = "".join("\t" if ch == "\t" else " " for ch in shown[:caret])
    message = f"{prefix}{shown}\n{' ' * len(prefix)}{pad}^"
    return InvalidSelectorError(message, selector=text, line=line, column=column)


_RESERVED = frozenset({"AND", "OR", "NOT", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE", "NULL"})  # TRUE/FALSE are values
# Terminals that can only start an operand (not '(' or '+'/'-', which also follow one).
_VALUE_START = frozenset({"IDENT", "INT", "HEX", "FLOAT", "STRING", "TRUE", "FALSE"})
_AFTER_IDENT = frozenset({"COMPOP", "MULOP", "IN", "LIKE", "IS", "BETWEEN"})
_BEFORE_VALUE = frozenset({"COMPOP", "ADDOP", "MULOP", "LPAR", "COMMA", "AND", "OR", "NOT", "BETWEEN"})
_TERMINAL_NAMES = [  # (terminal, how messages name it), in the order messages list them
    ("IDENT", "an identifier"),
    ("INT", "a number"),
    ("HEX", "a number"),
    ("FLOAT", "a number"),
    ("STRING", "a string literal"),
    ("TRUE", "TRUE"),
    ("FALSE", "FALSE"),
    ("LPAR", "'('"),
    ("COMPOP", "a comparison operator"),
    ("ADDOP", "'+' or '-'"),
    ("MULOP", "'*' or '/'"),
    ("NOT", "NOT"),
    ("BETWEEN", "BETWEEN"),
    ("IN", "IN"),
    ("LIKE", "LIKE"),
    ("IS", "IS"),
    ("NULL", "NULL"),
    ("ESCAPE", "ESCAPE"),
    ("AND", "AND"),
    ("OR", "OR"),
    ("COMMA", "','"),
    ("RPAR", "')'"),
    ("$END", "the end of the selector"),
]


def _shorten(s: str, width: int = 40) -> str:
    return s if len(s) <= width else s[: width - 3] + "..."


def _describe(tok: Token) -> str:
    kind = tok.type
    if kind == "$END":
        return "the end of the selector"
    if kind == "IDENT":
        return f"identifier '{_shorten(tok.value)}'"
    if kind == "STRING":
        return f"string literal {_shorten(tok.value)}"
    if kind in ("INT", "HEX", "FLOAT"):
        return f"number {_shorten(tok.value)}"
    if kind in _RESERVED or kind in ("TRUE", "FALSE"):
        return f"reserved word '{tok.value}'"
    return f"'{tok.value}'"


def _expected(names: set[str]) -> str:
    words: list[str] = []
    for terminal, word in _TERMINAL_NAMES:
        if terminal in names and word not in words:
            words.append(word)
    if not words:
        return "something else"
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _tokens(text: str) -> list[Token]:
    """The tokens of ``text`` up to the first lexical error."""
    found: list[Token] = []
    try:
        for tok in _parser().lex(text):
            found.append(tok)
    except UnexpectedInput:
        pass
    return found


def _syntax_error(text: str, exc: UnexpectedInput) -> InvalidSelectorError:
    if isinstance(exc, UnexpectedCharacters):
        pos = exc.pos_in_stream
        ch = text[pos]
        if ch == "'":
            return _error(text, pos, "unterminated string literal (no closing quote)")
        if ch == '"':
            return _error(text, pos, "unexpected character '\"' (string literals are written in single quotes)")
        if text.startswith("!=", pos):
            return _error(text, pos, "unexpected '!=' (the not-equal operator is '<>')")
        return _error(text, pos, f"unexpected character {ch!r}")
    if not isinstance(exc, UnexpectedToken):  # pragma: no cover - LALR raises only the two above
        return _error(text, getattr(exc, "pos_in_stream", 0) or 0, "syntax error")

    tok = exc.token
    expected = set(exc.expected)
    tokens = _tokens(text)
    at_end = tok.type == "$END"
    if at_end:
        index = len(tokens)
        pos = tokens[-1].end_pos if tokens else len(text)
    else:
        index = next((i for i, t in enumerate(tokens) if t.start_pos == tok.start_pos), len(tokens))
        pos = tok.start_pos
    prev = tokens[index - 1] if index >= 1 else None
    before_prev = tokens[index - 2] if index >= 2 else None
    after = tokens[index + 1] if index + 1 < len(tokens) else None
    wants_value = bool(expected & _VALUE_START)

    # A reserved word where an identifier was meant: `and = 1`, `x = 1 OR in IS NULL`.
    if tok.type in _RESERVED and wants_value:
        if after is not None and after.type in _AFTER_IDENT:
            return _error(text, pos, f"'{tok.value}' is a reserved word and cannot be used as an identifier")
        if tok.type == "NULL":
            return _error(
                text, pos, "NULL is not a value: test for it with IS NULL or IS NOT NULL"
            )
    # `NOT = 1`: NOT parsed as the operator, then the '=' makes no sense.
    if (
        prev is not None
        and prev.type in _RESERVED
        and tok.type in _AFTER_IDENT
        and (before_prev is None or before_prev.type in _BEFORE_VALUE)
    ):
        return _error(text, prev.start_pos, f"'{prev.value}' is a reserved word and cannot be used as an identifier")
    if wants_value:
        what = "expected a string literal" if expected <= {"STRING"} else "expected a value"
        if prev is not None:
            what += f" after '{_shorten(prev.value)}'"
        if not at_end:
            what += f", found {_describe(tok)}"
        return _error(text, pos, what)
    if tok.type == "RPAR" or (at_end and "RPAR" in expected):
        opened: list[Token] = []
        for t in tokens[:index]:
            if t.type == "LPAR":
                opened.append(t)
            elif t.type == "RPAR" and opened:
                opened.pop()
        if tok.type == "RPAR" and not opened:
            return _error(text, pos, "unexpected ')' without a matching '('")
        if at_end and opened:
            line, column, _ = _locate(text, opened[-1].start_pos)
            return _error(text, pos, f"missing ')' (the '(' of line {line}, column {column} is not closed)")
    if at_end:
        where = f" after '{_shorten(prev.value)}'" if prev is not None else ""
        return _error(text, pos, f"unexpected end of the selector{where}; expected {_expected(expected)}")
    if tok.type in _VALUE_START | {"LPAR"} and expected & {"COMPOP", "AND", "OR", "$END"}:
        return _error(text, pos, f"unexpected {_describe(tok)} (an operator is missing before it?)")
    return _error(text, pos, f"unexpected {_describe(tok)}; expected {_expected(expected)}")


# ====================================================================== checking

# Static types: a value whose type is known at compile time is "num", "str" or
# "bool" (a condition or boolean literal); an identifier is "any".
_NUM, _STR, _BOOL, _ANY = "num", "str", "bool", "any"
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_MAX_DEPTH = 100  # parse-tree levels; real selectors use a handful
_HEADERS = {
    "JMSPriority": "e.priority",
    "JMSMessageID": "e.message_id",
    "JMSTimestamp": "e.timestamp",
    "JMSCorrelationID": "e.correlation_id",
    "JMSType": "e.type",
    "JMSDeliveryMode": "('PERSISTENT' if e.delivery_mode == 2 else 'NON_PERSISTENT')",
}
_FLIP = {"=": "=", "<>": "<>", "<": ">", ">": "<", "<=": ">=", ">=": "<="}


class _Node:
    """A checked selector expression.

    kind   type  args            value
    lit    *     -               the Python value
    prop   any   -               property name
    header any   -               Python code reading the header from ``e``
    null   any   -               -                  (an unknown JMS... name)
    neg/pos num  [x]             -
    arith  num   operands        tuple of operators
    cmp    bool  [l, r]          (operator, operand type); a literal is on the right
                                 (operand type bool with a literal: an identifier
                                 against TRUE/FALSE, and the operator is '=')
    between bool [x, lo, hi]     negated
    in     bool  [x]             (negated, frozenset of strings)
    like   bool  [x]             (negated, _Like)
    isnull bool  [x]             negated
    xpath  bool  -               compiled lxml XPath
    and/or bool  operands        -
    not    bool  [x]             -
    """

    __slots__ = ("kind", "type", "pos", "end", "args", "value")

    def __init__(self, kind: str, type_: str, pos: int, end: int, args: tuple = (), value: Any = None) -> None:
        self.kind = kind
        self.type = type_
        self.pos = pos
        self.end = end
        self.args = args
        self.value = value


def _span(item: Tree | Token) -> tuple[int, int]:
    if isinstance(item, Token):
        return item.start_pos, item.end_pos
    if not item.meta.empty:
        return item.meta.start_pos, item.meta.end_pos
    children = [c for c in item.children if c is not None]  # pragma: no cover - every rule has tokens
    return _span(children[0])[0], _span(children[-1])[1]


def _unquote(tok: Token) -> str:
    return tok.value[1:-1].replace("''", "'")


def _char_offsets(tok: Token) -> list[int]:
    """Source offset of each character of a string literal's value."""
    raw, offsets, i = tok.value, [], 1
    while i < len(raw) - 1:
        offsets.append(tok.start_pos + i)
        i += 2 if raw[i] == "'" else 1
    return offsets


class _Like:
    """A LIKE pattern: a regex for the general case, and when possible a
    cheaper string test (``shape`` is exact, prefix, suffix, contains, any)."""

    __slots__ = ("regex", "shape", "literal")

    def __init__(self, parts: list[str | None]) -> None:
        # parts: literal characters, "_" as the string "\0one", and None for '%'
        segments: list[list[str]] = [[]]
        for part in parts:
            if part is None:
                if segments[-1] or len(segments) == 1:  # '%%' is '%'
                    segments.append([])
            else:
                segments[-1].append(part)
        # segments[0] is anchored at the start, segments[-1] at the end (if
        # there was a '%'), the ones between float. Matching each floating
        # segment at its leftmost place is correct for LIKE and, in atomic
        # groups, keeps the regex linear instead of backtracking.
        def rx(seg: list[str]) -> str:
            return "".join("." if c == "\0one" else re.escape(c) for c in seg)

        if len(segments) == 1:
            pattern = rx(segments[0])
        else:
            middle = "".join(f"(?>.*?{rx(s)})" for s in segments[1:-1] if s)
            pattern = f"{rx(segments[0])}{middle}.*{rx(segments[-1])}"
        self.regex = re.compile(pattern, re.DOTALL)
        self.shape, self.literal = "regex", None
        if not any(c == "\0one" for s in segments for c in s):
            texts = ["".join(s) for s in segments]
            if len(texts) == 1:
                self.shape, self.literal = "exact", texts[0]
            elif len(texts) == 2 and not texts[0] and not texts[1]:
                self.shape = "any"
            elif len(texts) == 2 and not texts[1]:
                self.shape, self.literal = "prefix", texts[0]
            elif len(texts) == 2 and not texts[0]:
                self.shape, self.literal = "suffix", texts[1]
            elif len(texts) == 3 and not texts[0] and not texts[2]:
                self.shape, self.literal = "contains", texts[1]


class _Checker:
    """Turns the lark tree into checked :class:`_Node` s."""

    def __init__(self, text: str, namespaces: Mapping[str, str] | None) -> None:
        self.text = text
        self.namespaces = dict(namespaces) if namespaces else None

    # ------------------------------------------------------------ helpers

    def error(self, pos: int, what: str) -> InvalidSelectorError:
        return _error(self.text, pos, what)

    def describe(self, node: _Node) -> str:
        snippet = f"'{_shorten(self.text[node.pos : node.end].strip())}'"
        if node.kind == "lit":
            if node.type == _STR:
                return f"string literal {_shorten(self.text[node.pos : node.end])}"
            return f"{'boolean literal' if node.type == _BOOL else 'number'} {snippet}"
        if node.type == _NUM:
            return f"arithmetic expression {snippet}"
        if node.type == _BOOL:
            return f"condition {snippet}"
        return f"identifier {snippet}"

    def condition(self, node: _Node, context: str) -> _Node:
        if node.type not in (_BOOL, _ANY):
            raise self.error(node.pos, f"{context} needs a condition, found {self.describe(node)}")
        return node

    def number(self, node: _Node, context: str) -> _Node:
        if node.type not in (_NUM, _ANY):
            raise self.error(node.pos, f"{context} needs a number, found {self.describe(node)}")
        return node

    def identifier(self, node: _Node, context: str) -> _Node:
        if node.kind not in ("prop", "header", "null"):
            raise self.error(node.pos, f"{context} needs an identifier on its left, found {self.describe(node)}")
        return node

    # ------------------------------------------------------------ dispatch

    def selector(self, tree: Tree | Token) -> _Node:
        node = self.build(tree, 0)
        if node.type not in (_BOOL, _ANY):
            raise self.error(
                node.pos, f"a selector must be a condition (TRUE or FALSE), found {self.describe(node)}"
            )
        return node

    def build(self, item: Tree | Token, depth: int) -> _Node:
        if depth > _MAX_DEPTH:
            raise self.error(_span(item)[0], f"the selector is nested too deeply (more than {_MAX_DEPTH} levels)")
        if isinstance(item, Token):
            return self.token(item)
        return getattr(self, "r_" + item.data)(item, depth + 1)

    def token(self, tok: Token, sign: str = "") -> _Node:
        pos, end, kind = tok.start_pos, tok.end_pos, tok.type
        if kind == "IDENT":
            name = tok.value
            if name in _HEADERS:
                return _Node("header", _ANY, pos, end, value=_HEADERS[name])
            if name.startswith("JMS") and not name.startswith(("JMSX", "JMS_")):
                return _Node("null", _ANY, pos, end)
            return _Node("prop", _ANY, pos, end, value=name)
        if kind in ("INT", "HEX"):
            digits = tok.value.rstrip("lL")
            if kind == "HEX":
                value = int(digits[2:], 16)
            elif len(digits) > 1 and digits[0] == "0":
                if not digits.isdigit() or any(c in "89" for c in digits):
                    raise self.error(pos, f"invalid octal literal {tok.value} (a leading 0 means octal)")
                value = int(digits, 8)
            else:
                value = int(digits)
            if sign == "-":
                value = -value
            if not _LONG_MIN <= value <= _LONG_MAX:
                raise self.error(pos, f"exact numeric literal {sign}{tok.value} is out of the range of a long")
            return _Node("lit", _NUM, pos, end, value=value)
        if kind == "FLOAT":
            value = float(tok.value.rstrip("fFdD"))
            if math.isinf(value):
                raise self.error(pos, f"approximate numeric literal {tok.value} is out of the range of a double")
            return _Node("lit", _NUM, pos, end, value=-value if sign == "-" else value)
        if kind == "STRING":
            return _Node("lit", _STR, pos, end, value=_unquote(tok))
        if kind in ("TRUE", "FALSE"):
            return _Node("lit", _BOOL, pos, end, value=kind == "TRUE")
        raise self.error(pos, f"unexpected {_describe(tok)}")  # pragma: no cover - the grammar prevents it

    # ------------------------------------------------------------ rules

    def r_or_expr(self, tree: Tree, depth: int) -> _Node:
        return self.logical("or", tree, depth)

    def r_and_expr(self, tree: Tree, depth: int) -> _Node:
        return self.logical("and", tree, depth)

    def logical(self, kind: str, tree: Tree, depth: int) -> _Node:
        args: list[_Node] = []
        for child in tree.children:
            if isinstance(child, Token) and child.type in ("AND", "OR"):
                continue
            node = self.condition(self.build(child, depth), kind.upper())
            args.extend(node.args if node.kind == kind else (node,))
        return _Node(kind, _BOOL, *_span(tree), args=tuple(args))

    def r_not_(self, tree: Tree, depth: int) -> _Node:
        operand = self.condition(self.build(tree.children[1], depth), "NOT")
        return _Node("not", _BOOL, *_span(tree), args=(operand,))

    def r_sign(self, tree: Tree, depth: int) -> _Node:
        op, operand = tree.children
        pos, end = _span(tree)
        if isinstance(operand, Token) and operand.type in ("INT", "HEX", "FLOAT"):
            node = self.token(operand, sign=op.value)
            node.pos, node.end = pos, end
            return node
        node = self.number(self.build(operand, depth), f"unary '{op.value}'")
        if node.kind == "lit":
            return _Node("lit", _NUM, pos, end, value=-node.value if op.value == "-" else node.value)
        return _Node("neg" if op.value == "-" else "pos", _NUM, pos, end, args=(node,))

    def r_sum(self, tree: Tree, depth: int) -> _Node:
        return self.arithmetic(tree, depth)

    def r_product(self, tree: Tree, depth: int) -> _Node:
        return self.arithmetic(tree, depth)

    def arithmetic(self, tree: Tree, depth: int) -> _Node:
        children = tree.children
        operands = [self.build(c, depth) for c in children[0::2]]
        ops = tuple(t.value for t in children[1::2])
        for i, node in enumerate(operands):
            self.number(node, f"'{ops[max(0, i - 1)]}'")
        pos, end = _span(tree)
        if all(n.kind == "lit" for n in operands):  # fold constants (unless it divides by zero)
            value = _chain(ops, tuple(n.value for n in operands))
            if value is not None:
                return _Node("lit", _NUM, pos, end, value=value)
        return _Node("arith", _NUM, pos, end, args=tuple(operands), value=ops)

    def r_comparison(self, tree: Tree, depth: int) -> _Node:
        left_tree, op_tok, right_tree = tree.children
        left, right, op = self.build(left_tree, depth), self.build(right_tree, depth), op_tok.value
        pos, end = _span(tree)
        known = [t for t in (left.type, right.type) if t != _ANY]
        if len(known) == 2 and known[0] != known[1]:
            raise self.error(
                op_tok.start_pos,
                f"cannot compare {self.describe(left)} with {self.describe(right)}: only like types compare",
            )
        kind = known[0] if known else _ANY
        if op not in ("=", "<>") and kind in (_STR, _BOOL):
            what = "strings" if kind == _STR else "booleans"
            raise self.error(op_tok.start_pos, f"'{op}' cannot compare {what}: {what} only take = and <>")
        if kind == _BOOL:
            for this, other in ((left, right), (right, left)):
                if other.kind == "lit":
                    want = other.value if op == "=" else not other.value  # `x <> TRUE` is `x = FALSE`
                    if this.type == _BOOL:  # a condition: `c = TRUE` is c, `c = FALSE` is NOT c
                        return this if want else _Node("not", _BOOL, pos, end, args=(this,))
                    # an identifier, which may hold a non-boolean: `x = <want>`
                    lit = _Node("lit", _BOOL, other.pos, other.end, value=want)
                    return _Node("cmp", _BOOL, pos, end, args=(this, lit), value=("=", _BOOL))
        elif left.kind == "lit" and right.kind != "lit":
            left, right, op = right, left, _FLIP[op]
        return _Node("cmp", _BOOL, pos, end, args=(left, right), value=(op, kind))

    def r_between(self, tree: Tree, depth: int) -> _Node:
        x, negated, _kw, lo, _and, hi = tree.children
        context = "NOT BETWEEN" if negated else "BETWEEN"
        args = tuple(self.number(self.build(c, depth), context) for c in (x, lo, hi))
        return _Node("between", _BOOL, *_span(tree), args=args, value=negated is not None)

    def r_in_(self, tree: Tree, depth: int) -> _Node:
        x, negated, _kw, _lpar, items, rpar = tree.children
        context = "NOT IN" if negated else "IN"
        subject = self.identifier(self.build(x, depth), context)
        if items is None:
            raise self.error(rpar.start_pos, f"the {context} list is empty: it needs at least one string literal")
        values = set()
        for item in items.children:
            if isinstance(item, Token) and item.type == "COMMA":
                continue
            node = self.build(item, depth)
            if node.kind != "lit" or node.type != _STR:
                raise self.error(node.pos, f"the {context} list holds string literals only, found {self.describe(node)}")
            values.add(node.value)
        return _Node("in", _BOOL, *_span(tree), args=(subject,), value=(negated is not None, frozenset(values)))

    def r_like(self, tree: Tree, depth: int) -> _Node:
        x, negated, _kw, pattern_tok, _esc_kw, escape_tok = tree.children
        context = "NOT LIKE" if negated else "LIKE"
        subject = self.identifier(self.build(x, depth), context)
        escape = None
        if escape_tok is not None:
            escape = _unquote(escape_tok)
            if len(escape) != 1:
                found = "an empty string" if not escape else f"{len(escape)} characters"
                raise self.error(
                    escape_tok.start_pos, f"the ESCAPE character must be a single character, found {found}"
                )
        pattern = _unquote(pattern_tok)
        offsets = _char_offsets(pattern_tok)
        parts: list[str | None] = []
        i = 0
        while i < len(pattern):
            ch = pattern[i]
            if ch == escape:
                if i + 1 == len(pattern):
                    raise self.error(
                        offsets[i], f"the LIKE pattern ends with its escape character {escape!r}: nothing to escape"
                    )
                parts.append(pattern[i + 1])
                i += 2
                continue
            parts.append(None if ch == "%" else "\0one" if ch == "_" else ch)
            i += 1
        return _Node("like", _BOOL, *_span(tree), args=(subject,), value=(negated is not None, _Like(parts)))

    def r_is_null(self, tree: Tree, depth: int) -> _Node:
        x, _is, negated, _null = tree.children
        subject = self.identifier(self.build(x, depth), "IS NOT NULL" if negated else "IS NULL")
        return _Node("isnull", _BOOL, *_span(tree), args=(subject,), value=negated is not None)

    def r_xpath(self, tree: Tree, depth: int) -> _Node:
        name, expr_tok = tree.children
        pos, end = _span(tree)
        if name.value.upper() != "XPATH":
            raise self.error(
                expr_tok.start_pos,
                f"unexpected string literal after identifier '{_shorten(name.value)}' (an operator is missing?)",
            )
        expr = _unquote(expr_tok)
        try:
            xpath = etree.XPath(expr, namespaces=self.namespaces, smart_strings=False)
        except etree.XPathSyntaxError as exc:
            raise self.error(expr_tok.start_pos, f"invalid XPath expression {_shorten(expr)!r}: {exc}") from None
        except (etree.XPathError, TypeError, ValueError) as exc:
            raise self.error(expr_tok.start_pos, f"cannot compile XPath expression {_shorten(expr)!r}: {exc}") from None
        try:  # catches unknown prefixes, functions and variables now rather than per message
            xpath(etree.Element("selector-check"))
        except etree.XPathError as exc:
            raise self.error(expr_tok.start_pos, f"cannot evaluate XPath expression {_shorten(expr)!r}: {exc}") from None
        return _Node("xpath", _BOOL, pos, end, value=xpath)


# ====================================================================== runtime helpers
# Called by the generated code for everything but the common fast paths. None
# stands for NULL / UNKNOWN. They never raise for any operand.


def _num(v: Any) -> Any:
    """``v`` if it is a JMS number (int or float but not bool), else None."""
    c = v.__class__
    if c is int or c is float:
        return v
    if c is bool or v is None:
        return None
    return v if isinstance(v, (int, float)) else None


def _kind(v: Any) -> int:
    """1 string, 2 number, 3 boolean, 0 a type the selector does not know."""
    c = v.__class__
    if c is str:
        return 1
    if c is int or c is float:
        return 2
    if c is bool:
        return 3
    if isinstance(v, str):
        return 1
    if isinstance(v, (int, float)):
        return 2
    return 0


# Comparisons: UNKNOWN when an operand is NULL; FALSE (whatever the operator)
# when the operands are of unlike types or of a type the selector does not know.


def _eq(a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    k = _kind(a)
    if k == 0 or k != _kind(b):
        return False  # unlike types
    return True if a == b else False


def _ne(a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    k = _kind(a)
    if k == 0 or k != _kind(b):
        return False  # unlike types: FALSE too, not the negation of _eq
    return False if a == b else True


def _unordered(a: Any, b: Any) -> bool | None:
    """``<`` ``<=`` ``>`` ``>=`` of two non-NULL values that are not both
    numbers: UNKNOWN for two strings or two booleans (JMS does not order
    them), FALSE for unlike types."""
    k = _kind(a)
    return None if k != 0 and k == _kind(b) else False


def _lt(a: Any, b: Any) -> bool | None:
    x, y = _num(a), _num(b)
    if x is None or y is None:
        return None if a is None or b is None else _unordered(a, b)
    return x < y


def _le(a: Any, b: Any) -> bool | None:
    x, y = _num(a), _num(b)
    if x is None or y is None:
        return None if a is None or b is None else _unordered(a, b)
    return x <= y


def _gt(a: Any, b: Any) -> bool | None:
    x, y = _num(a), _num(b)
    if x is None or y is None:
        return None if a is None or b is None else _unordered(a, b)
    return x > y


def _ge(a: Any, b: Any) -> bool | None:
    x, y = _num(a), _num(b)
    if x is None or y is None:
        return None if a is None or b is None else _unordered(a, b)
    return x >= y


def _between(x: Any, lo: Any, hi: Any) -> bool | None:  # lo <= x AND x <= hi
    first = _le(lo, x)
    if first is False:
        return False
    second = _le(x, hi)
    if second is False:
        return False
    return None if first is None or second is None else True


def _not_between(x: Any, lo: Any, hi: Any) -> bool | None:  # x < lo OR x > hi
    first = _lt(x, lo)
    if first is True:
        return True
    second = _gt(x, hi)
    if second is True:
        return True
    return None if first is None or second is None else False


# IN and LIKE: UNKNOWN for NULL; for any other non-string, IN and LIKE are
# FALSE and NOT IN and NOT LIKE are TRUE.


def _in(v: Any, values: frozenset) -> bool | None:
    if v is None:
        return None
    return (v in values) if isinstance(v, str) else False


def _not_in(v: Any, values: frozenset) -> bool | None:
    if v is None:
        return None
    return (v not in values) if isinstance(v, str) else True


def _like(v: Any, regex: re.Pattern) -> bool | None:
    if v is None:
        return None
    return (regex.fullmatch(v) is not None) if isinstance(v, str) else False


def _not_like(v: Any, regex: re.Pattern) -> bool | None:
    if v is None:
        return None
    return (regex.fullmatch(v) is None) if isinstance(v, str) else True


def _neg(v: Any) -> Any:
    v = _num(v)
    return None if v is None else -v


def _add(a: Any, b: Any) -> Any:
    a, b = _num(a), _num(b)
    if a is None or b is None:
        return None
    try:
        return a + b
    except ArithmeticError:  # int too large to convert to float
        return None


def _sub(a: Any, b: Any) -> Any:
    a, b = _num(a), _num(b)
    if a is None or b is None:
        return None
    try:
        return a - b
    except ArithmeticError:
        return None


def _mul(a: Any, b: Any) -> Any:
    a, b = _num(a), _num(b)
    if a is None or b is None:
        return None
    try:
        return a * b
    except ArithmeticError:
        return None


def _div(a: Any, b: Any) -> Any:
    a, b = _num(a), _num(b)
    if a is None or b is None or b == 0:
        return None
    try:
        if isinstance(a, int) and isinstance(b, int):  # Java: truncate toward zero
            q = a // b
            return q + 1 if q < 0 and q * b != a else q
        return a / b
    except ArithmeticError:
        return None


_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_EXACT = re.compile(r"[+-]?[0-9]+")
#: Longer strings are not numbers to a selector (a long has 19 digits, a double ~17 significant ones).
_MAX_NUMBER_TEXT = 64


def string_number(text: str) -> int | float | None:
    """The number a string holds as a decimal literal (an int without
    fraction or exponent, within a long; else a finite float), or None."""
    if len(text) > _MAX_NUMBER_TEXT or _DECIMAL.fullmatch(text) is None:
        return None
    if _EXACT.fullmatch(text) is not None:
        value = int(text)
        return value if _LONG_MIN <= value <= _LONG_MAX else None
    value = float(text)
    return value if math.isfinite(value) else None


#: Strings seen lately and what they hold (``v`` itself for a string that is no
#: number): a value is parsed once, not at every evaluation by every consumer.
_string_numbers: dict[str, Any] = {}
_STRING_NUMBERS_KEPT = 4096


def _sn(v: Any, props: Any) -> Any:
    """A string property where a number is wanted: its number when the
    message is marked so and it holds one, else the string itself."""
    if props.get(STRING_NUMBERS_PROPERTY) is not True or v.__class__ is not str:
        return v
    n = _string_numbers.get(v)
    if n is None:
        n = string_number(v)
        if n is None:
            n = v
        if len(_string_numbers) >= _STRING_NUMBERS_KEPT:
            _string_numbers.clear()
        _string_numbers[v] = n
    return n


def _pair(a: Any, b: Any, props: Any, ordering: bool) -> tuple[Any, Any]:
    """Two identifiers compared: for ``<`` ``<=`` ``>`` ``>=`` (``ordering``)
    each string is read as a number; for ``=`` and ``<>`` a string only when
    the other is a number."""
    if a.__class__ is not str and b.__class__ is not str:
        return a, b
    if ordering:
        return _sn(a, props), _sn(b, props)
    if isinstance(a, str) and _num(b) is not None:
        return _sn(a, props), b
    if isinstance(b, str) and _num(a) is not None:
        return a, _sn(b, props)
    return a, b


_ARITH = {"+": _add, "-": _sub, "*": _mul, "/": _div}
_ARITH_NAMES = {"+": "_add", "-": "_sub", "*": "_mul", "/": "_div"}


def _chain(ops: tuple, values: tuple) -> Any:
    result = values[0]
    for op, value in zip(ops, values[1:]):
        result = _ARITH[op](result, value)
    return result


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


_RUNTIME = {
    "__builtins__": {},
    "_eq": _eq,
    "_ne": _ne,
    "_lt": _lt,
    "_le": _le,
    "_gt": _gt,
    "_ge": _ge,
    "_between": _between,
    "_not_between": _not_between,
    "_in": _in,
    "_not_in": _not_in,
    "_like": _like,
    "_not_like": _not_like,
    "_neg": _neg,
    "_num": _num,
    "_add": _add,
    "_sub": _sub,
    "_mul": _mul,
    "_div": _div,
    "_chain": _chain,
    "_xpath": _xpath,
    "_sn": _sn,
    "_pair": _pair,
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
}
_SLOW_CMP = {"=": "_eq", "<>": "_ne", "<": "_lt", "<=": "_le", ">": "_gt", ">=": "_ge"}
_PY_CMP = {"=": "==", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


# ====================================================================== code generation


class _Generator:
    """Writes the Python source of a selector's test function.

    Three code forms exist for a node:

    * ``value``: the operand's value (any Python object, None for NULL);
    * ``cond``: a three-valued condition: True, False or None (UNKNOWN);
    * ``test(want)``: a plain bool, "the node evaluates to ``want``". This is
      what the top of a selector needs, and it distributes exactly over
      Kleene logic (AND is TRUE iff all operands are TRUE, FALSE iff one is
      FALSE; NOT x is TRUE iff x is FALSE), so AND/OR/NOT cost no
      bookkeeping of UNKNOWN.

    Leaves with a cheap common case (an identifier against a literal) are
    written as ``FAST if GUARD else SLOW``: GUARD checks the run-time type
    exactly (``v.__class__ is str``), FAST is one Python comparison, SLOW calls
    a helper that handles NULL, subclasses and unlike types.

    Sub-expressions nested deeper than ``_HOIST`` levels are moved into helper
    functions, which keeps the generated code within Python's nesting limits.
    """

    _HOIST = 16

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = dict(_RUNTIME)
        self.helpers: list[str] = []
        self.count = 0
        self.uses_properties = False

    def function(self, node: _Node) -> tuple[str, dict[str, Any]]:
        body = self.test(node, True, 0)
        props = "e.properties" if self.uses_properties else "None"
        source = "".join(self.helpers) + f"def _selector(e):\n    _P = {props}\n    return {body}\n"
        return source, self.namespace

    # ------------------------------------------------------------ plumbing

    def temp(self) -> str:
        self.count += 1
        return f"_{self.count}"

    def const(self, value: Any) -> str:
        if value is None or value is True or value is False:
            return repr(value)
        if type(value) is str or type(value) is int or (type(value) is float and math.isfinite(value)):
            return f"({value!r})" if not isinstance(value, str) and value < 0 else repr(value)
        self.count += 1
        name = f"_k{self.count}"
        self.namespace[name] = value
        return name

    def hoist(self, make: Callable[[], str]) -> str:
        self.count += 1
        name = f"_h{self.count}"
        self.helpers.append(f"def {name}(e, _P):\n    return {make()}\n")
        return f"{name}(e, _P)"

    # ------------------------------------------------------------ values

    def value(self, node: _Node, depth: int) -> str:
        if depth >= self._HOIST:
            return self.hoist(lambda: self.value(node, 0))
        kind = node.kind
        if kind == "lit":
            return self.const(node.value)
        if kind == "prop":
            self.uses_properties = True
            return f"_P.get({node.value!r})"
        if kind == "header":
            return node.value
        if kind == "null":
            return "None"
        if kind == "neg":
            return f"_neg({self.num_value(node.args[0], depth + 1)})"
        if kind == "pos":
            return f"_num({self.num_value(node.args[0], depth + 1)})"
        if kind == "arith":
            operands = [self.num_value(a, depth + 1) for a in node.args]
            if len(operands) <= 4:
                code = operands[0]
                for op, operand in zip(node.value, operands[1:]):
                    code = f"{_ARITH_NAMES[op]}({code}, {operand})"
                return code
            return f"_chain({node.value!r}, ({', '.join(operands)},))"
        return self.cond(node, depth)

    def num_value(self, node: _Node, depth: int) -> str:
        """The value of an operand where a number is wanted: a string
        property goes through ``_sn`` (a type check costs the others)."""
        if node.kind != "prop":
            return self.value(node, depth)
        t = self.temp()
        return f"({t} if ({t} := {self.value(node, depth)}).__class__ is not str else _sn({t}, _P))"

    @staticmethod
    def slow_num(call: str, v: str, rest: str, convert: bool) -> str:
        """``call(v, rest)``, with ``v`` (a bound property value) through
        ``_sn`` first when it is a string."""
        if not convert:
            return f"{call}({v}, {rest})"
        return f"({call}(_sn({v}, _P), {rest}) if {v}.__class__ is str else {call}({v}, {rest}))"

    # ------------------------------------------------------------ conditions

    def cond(self, node: _Node, depth: int) -> str:
        if depth >= self._HOIST:
            return self.hoist(lambda: self.cond(node, 0))
        kind = node.kind
        if node.type == _ANY:  # an identifier used as a condition
            t = self.temp()
            return f"({t} if ({t} := {self.value(node, depth + 1)}).__class__ is bool else None)"
        if kind == "lit":
            return self.const(node.value)
        if kind in ("and", "or"):
            # AND: FALSE if any is FALSE, else UNKNOWN if any is UNKNOWN, else TRUE.
            # OR is the dual. Flat, short-circuit, each operand evaluated once.
            decisive, other = (False, True) if kind == "and" else (True, False)
            temps = [self.temp() for _ in node.args]
            firsts = " or ".join(
                f"({t} := {self.cond(a, depth + 1)}) is {decisive}" for t, a in zip(temps, node.args)
            )
            unknown = " or ".join(f"{t} is None" for t in temps)
            return f"({decisive} if {firsts} else (None if {unknown} else {other}))"
        if kind == "not":
            t = self.temp()
            return f"(None if ({t} := {self.cond(node.args[0], depth + 1)}) is None else not {t})"
        if kind == "isnull":
            return f"({self.value(node.args[0], depth + 1)} is {'not ' if node.value else ''}None)"
        if kind == "xpath":
            return f"_xpath(e, {self.const(node.value)})"
        if kind == "cmp" and node.value[1] == _BOOL:
            op, (left, right) = node.value[0], node.args
            if right.kind == "lit":  # identifier = TRUE/FALSE: FALSE for a non-boolean
                v = self.temp()
                return f"(None if ({v} := {self.value(left, depth + 1)}) is None else {v} is {right.value})"
            if left.type == _BOOL and right.type == _BOOL:  # two conditions: each True, False or None
                a, b = self.temp(), self.temp()
                lc, rc = self.cond(left, depth + 1), self.cond(right, depth + 1)
                same = "is" if op == "=" else "is not"
                return f"(None if ({a} := {lc}) is None or ({b} := {rc}) is None else {a} {same} {b})"
            # an identifier (any value) against a condition
            a, b = (self.cond(x, depth + 1) if x.type == _BOOL else self.value(x, depth + 1) for x in node.args)
            return f"{_SLOW_CMP[op]}({a}, {b})"
        fast = self.fast(node, depth)
        if fast is not None:
            guard, quick, slow = fast
            return f"(({quick}) if {guard} else {slow})"
        return self.slow(node, depth)

    def slow(self, node: _Node, depth: int) -> str:
        """A helper call computing a comparison-like leaf (no fast path)."""
        kind = node.kind
        if kind == "cmp":
            op, type_ = node.value
            if type_ == _NUM:
                left, right = (self.num_value(x, depth + 1) for x in node.args)
            else:
                left, right = (self.value(x, depth + 1) for x in node.args)
                if type_ == _ANY and any(x.kind == "prop" for x in node.args):
                    ordering = op not in ("=", "<>")
                    return f"{_SLOW_CMP[op]}(*_pair({left}, {right}, _P, {ordering}))"
            return f"{_SLOW_CMP[op]}({left}, {right})"
        if kind == "between":
            x, lo, hi = (self.num_value(a, depth + 1) for a in node.args)
            return f"{'_not_between' if node.value else '_between'}({x}, {lo}, {hi})"
        raise AssertionError(kind)  # pragma: no cover - in/like always have a fast path

    def fast(self, node: _Node, depth: int) -> tuple[str, str, str] | None:
        """(guard, fast, slow) for a leaf with a cheap common case, else None."""
        kind = node.kind
        if kind == "cmp":
            op, type_ = node.value
            left, right = node.args
            if right.kind != "lit" or type_ not in (_NUM, _STR):
                return None
            v, c = self.temp(), self.const(right.value)
            x = self.value(left, depth + 1)
            if type_ == _NUM:
                t = self.temp()
                guard = f"(({t} := ({v} := {x}).__class__) is int or {t} is float)"
                slow = self.slow_num(_SLOW_CMP[op], v, c, left.kind == "prop")
            else:
                guard = f"(({v} := {x}).__class__ is str)"
                slow = f"{_SLOW_CMP[op]}({v}, {c})"
            return guard, f"{v} {_PY_CMP[op]} {c}", slow
        if kind == "between":
            x, lo, hi = node.args
            if lo.kind != "lit" or hi.kind != "lit":
                return None
            v, t = self.temp(), self.temp()
            lo_c, hi_c = self.const(lo.value), self.const(hi.value)
            guard = f"(({t} := ({v} := {self.value(x, depth + 1)}).__class__) is int or {t} is float)"
            convert = x.kind == "prop"
            if node.value:
                return (guard, f"{v} < {lo_c} or {v} > {hi_c}",
                        self.slow_num("_not_between", v, f"{lo_c}, {hi_c}", convert))
            return guard, f"{lo_c} <= {v} <= {hi_c}", self.slow_num("_between", v, f"{lo_c}, {hi_c}", convert)
        if kind == "in":
            negated, values = node.value
            v, k = self.temp(), self.const(values)
            guard = f"(({v} := {self.value(node.args[0], depth + 1)}).__class__ is str)"
            if negated:
                return guard, f"{v} not in {k}", f"_not_in({v}, {k})"
            return guard, f"{v} in {k}", f"_in({v}, {k})"
        if kind == "like":
            negated, like = node.value
            v, r = self.temp(), self.const(like.regex)
            guard = f"(({v} := {self.value(node.args[0], depth + 1)}).__class__ is str)"
            if like.shape == "regex":
                quick = f"{r}.fullmatch({v}) is not None"
            elif like.shape == "any":
                quick = "True"
            else:
                lit = self.const(like.literal)
                quick = {
                    "exact": f"{v} == {lit}",
                    "prefix": f"{v}.startswith({lit})",
                    "suffix": f"{v}.endswith({lit})",
                    "contains": f"{lit} in {v}",
                }[like.shape]
            if negated:
                return guard, f"not ({quick})", f"_not_like({v}, {r})"
            return guard, quick, f"_like({v}, {r})"
        return None

    # ------------------------------------------------------------ tests

    def test(self, node: _Node, want: bool, depth: int) -> str:
        """Code for a plain bool: does ``node`` evaluate to ``want``?"""
        if depth >= self._HOIST:
            return self.hoist(lambda: self.test(node, want, 0))
        kind = node.kind
        if node.type == _ANY:  # an identifier as a condition: TRUE only for a boolean True
            return f"({self.value(node, depth + 1)} is {want})"
        if kind == "lit":
            return repr(node.value is want)
        if kind == "cmp" and node.value[1] == _BOOL and node.args[1].kind == "lit":
            x, lit = self.value(node.args[0], depth + 1), node.args[1].value
            if want:  # identifier = TRUE/FALSE
                return f"({x} is {lit})"
            v = self.temp()  # FALSE: any other non-NULL value
            return f"(({v} := {x}) is not None and {v} is not {lit})"
        if kind == "not":
            return self.test(node.args[0], not want, depth + 1)
        if kind in ("and", "or"):
            joiner = " and " if (kind == "and") == want else " or "
            return "(" + joiner.join(self.test(a, want, depth + 1) for a in node.args) + ")"
        if kind == "isnull":
            is_null = want != node.value
            return f"({self.value(node.args[0], depth + 1)} is {'' if is_null else 'not '}None)"
        fast = self.fast(node, depth)
        if fast is not None:
            guard, quick, slow = fast
            if want:
                return f"(({quick}) if {guard} else {slow} is True)"
            return f"(not ({quick}) if {guard} else {slow} is False)"
        return f"({self.cond(node, depth + 1)} is {want})"
