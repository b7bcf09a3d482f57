"""XPath expressions read as text, where the gateway checks what a configured path or a rule context can
match (:mod:`gateway.intake.schemas`, :mod:`gateway.rules.schematron`)."""

from __future__ import annotations

__all__ = ["without_predicates"]


def without_predicates(text: str) -> str | None:
    """*text* without its ``[...]`` predicates; None if brackets or quotes do not balance."""
    out: list[str] = []
    depth = 0
    quote: str | None = None
    for ch in text:
        if quote:
            if ch == quote:
                quote = None
            continue
        if depth and ch in "'\"":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            if not depth:
                return None
            depth -= 1
        elif not depth:
            out.append(ch)
    if depth or quote:
        return None
    return "".join(out)
