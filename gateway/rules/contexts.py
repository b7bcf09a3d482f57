"""What a rule's context can match, read from the XPath as text: a rule whose context cannot share a node with
an earlier rule of its pattern needs no exclusion, the common case."""

from __future__ import annotations

import re

from gateway.xpaths import without_predicates

# --------------------------------------------------------------------------- rule contexts


def _split_top(text: str, separator: str) -> list[str]:
    """*text* split at *separator* where it is outside brackets, parentheses, braces and string literals."""
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    start = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            i += len(separator)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return parts


def _alternatives(context: str) -> list[str]:
    return [a.strip() for part in _split_top(context, "|") for a in _split_top(part, " union ")]


def _context_select(context: str) -> str:
    """The expression selecting, from the document node, every node the match pattern *context* matches:
    an absolute path as it is, a relative one after ``//`` (as XSLT defines matching)."""
    selects = []
    for alt in _alternatives(context):
        if alt.startswith("/"):
            selects.append(alt)
        elif alt.startswith("document-node("):
            selects.append(f"(/)[self::{alt}]")
        else:
            selects.append(f"//{alt}")
    return selects[0] if len(selects) == 1 else " | ".join(f"({s})" for s in selects)


_STEP_TEST = re.compile(r"^(@|attribute::|child::)?(?:([A-Za-z_][\w.\-]*|\*):)?([A-Za-z_][\w.\-]*|\*)$")
_Test = tuple[str, "str | None", "str | None"]  # (kind, namespace or None for any, local name or None for any)
_Shape = tuple[bool, list["_Test | None"]]  # (anchored at the root, step tests; None: a step that can be anything)


def _shapes(context: str, namespaces: dict[str, str]) -> list[_Shape] | None:
    """The steps each alternative of a match pattern requires, from the last ``//`` on (None when they
    cannot be told: a function, a variable, a filter...)."""
    out: list[_Shape] = []
    for alt in _alternatives(context):
        steps = _split_top(alt, "/")
        anchored = steps[0].strip() == ""
        if anchored:
            steps = steps[1:]
        if "" in (s.strip() for s in steps):  # a '//': keep what follows the last one, unanchored
            last = max(i for i, s in enumerate(steps) if not s.strip())
            steps, anchored = steps[last + 1 :], False
        tests: list[_Test | None] = []
        for step in steps:
            bare = without_predicates(step) or ""  # unbalanced: a pattern Saxon refuses
            m = _STEP_TEST.match(bare.strip())
            if not m:
                if bare.strip() in ("node()", "*"):
                    tests.append(None)
                    continue
                return None
            kind = "attribute" if m.group(1) in ("@", "attribute::") else "element"
            prefix, local = m.group(2), m.group(3)
            if prefix is None:
                ns: str | None = None if local == "*" else ""
            elif prefix == "*":
                ns = None
            elif prefix in namespaces:
                ns = namespaces[prefix]
            else:
                return None
            tests.append((kind, ns, None if local == "*" else local))
        if not tests and not anchored:
            return None
        out.append((anchored, tests))
    return out


def _compatible(a: _Test | None, b: _Test | None) -> bool:
    if a is None or b is None:
        return True
    return (
        a[0] == b[0]
        and (a[1] is None or b[1] is None or a[1] == b[1])
        and (a[2] is None or b[2] is None or a[2] == b[2])
    )


def _may_overlap(a: list[_Shape] | None, b: list[_Shape] | None) -> bool:
    """Whether two rule contexts may match a node in common (False only when their steps show they can't:
    different names at some level from the node up, or fixed depths that differ)."""
    if a is None or b is None:
        return True
    for anchored, steps in a:
        for anchored2, steps2 in b:
            if anchored and anchored2 and len(steps) != len(steps2):
                continue
            if (anchored and len(steps2) > len(steps)) or (anchored2 and len(steps) > len(steps2)):
                continue
            if all(_compatible(x, y) for x, y in zip(reversed(steps), reversed(steps2), strict=False)):
                return True
    return False
