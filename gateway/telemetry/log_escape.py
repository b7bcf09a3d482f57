"""Escaping what goes into a text log line: one event, one line, whatever a client sent.

Request paths, operator names, header values and document ids come from clients. Written as they are, a
CR/LF in one of them would end the line and start a forged one (``... INFO gateway.admin: login of alice``),
and other control characters (ANSI escapes, backspaces) would rewrite what a terminal shows. The text
format writes each control character (C0, DEL, C1, and the Unicode line and paragraph separators) as a
Python-style escape: ``\\n``, ``\\r``, ``\\t``, ``\\x1b``, ``\\u2028``; a backslash stays as it is. The JSON
format needs nothing: JSON strings escape control characters already.
"""

from __future__ import annotations

import re

__all__ = ["escape_controls", "escape_block"]

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group(0)
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """*text* on one line: every control character escaped."""
    return _CONTROL.sub(_escape, text) if _CONTROL.search(text) else text


def escape_block(text: str) -> str:
    """A multi-line block (a traceback) kept on its lines, each escaped and indented, so that none of them
    can pass for a log line of its own."""
    return "\n".join("    " + escape_controls(line) for line in text.split("\n"))
