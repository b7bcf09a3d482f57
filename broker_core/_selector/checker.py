"""Checking: lark's parse tree to a typed tree of :class:`_Node`, with the
static type of every value, literals range-checked, LIKE patterns compiled
and XPath expressions compiled (:mod:`.xpath`). Every error is an
:class:`InvalidSelectorError` at the offending character."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from lark import Token, Tree

from .._errors import InvalidSelectorError
from .error_text import _describe, _error, _shorten
from .runtime import _LONG_MAX, _LONG_MIN, _chain
from .xpath import compile_xpath

# Static types: a value whose type is known at compile time is "num", "str" or
# "bool" (a condition or boolean literal); an identifier is "any".
_NUM, _STR, _BOOL, _ANY = "num", "str", "bool", "any"
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
            raise self.error(node.pos, f"a selector must be a condition (TRUE or FALSE), found {self.describe(node)}")
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
                raise self.error(
                    node.pos, f"the {context} list holds string literals only, found {self.describe(node)}"
                )
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
        xpath = compile_xpath(_unquote(expr_tok), self.namespaces, lambda what: self.error(expr_tok.start_pos, what))
        return _Node("xpath", _BOOL, pos, end, value=xpath)
