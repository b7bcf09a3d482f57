"""The text of an :class:`InvalidSelectorError`: the line of the selector with
a caret under the offending character, and for a syntax error what was
expected there, in words."""

from __future__ import annotations

import re

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from .._errors import InvalidSelectorError
from .grammar import _parser

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
            return _error(text, pos, "NULL is not a value: test for it with IS NULL or IS NOT NULL")
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
