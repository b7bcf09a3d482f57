"""Code generation: a checked tree (:mod:`.checker`) to the Python source of
one test function, run against :mod:`.runtime`'s helpers."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .checker import _ANY, _BOOL, _NUM, _STR, _Node
from .runtime import _ARITH_NAMES, _PY_CMP, _RUNTIME, _SLOW_CMP


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
                for op, operand in zip(node.value, operands[1:], strict=False):
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
                f"({t} := {self.cond(a, depth + 1)}) is {decisive}" for t, a in zip(temps, node.args, strict=False)
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
                return (
                    guard,
                    f"{v} < {lo_c} or {v} > {hi_c}",
                    self.slow_num("_not_between", v, f"{lo_c}, {hi_c}", convert),
                )
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
