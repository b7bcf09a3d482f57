"""The selector grammar (``selector.lark``, next to this module) and its LALR
parser, built once on first use and shared by all threads."""

from __future__ import annotations

import threading
from pathlib import Path

from lark import Lark

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
