"""Whether a configured XPath can match: each child step checked against the elements a schema declares,
so that a route's or a rule's path with a typo is reported when the configuration loads, not never matched."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from lxml import etree
from xmlschema.validators import XsdAnyElement, XsdElement

from gateway.errors import clip
from gateway.xpaths import without_predicates

__all__ = ["check_path"]


def check_path(
    bundle: Any, name: str, roots_of: frozenset[str], path: str, namespaces: Mapping[str, str]
) -> str | None:
    """Check that an XPath's child steps name elements the schema declares (*bundle*: its xmlschema
    bundle; *name*: its name for messages; *roots_of*: the root elements it declares).

    *path* is absolute (``/ord:Order/cac:OrderLine/cbc:ID``, its first step the root) or relative to the root
    (``cac:BuyerCustomerParty/cac:Party/cac:PartyName/cbc:Name``). Predicates are ignored; a last step may be
    ``@attribute`` or ``text()``; a ``*`` step or an element whose content is a wildcard ends the check
    (anything may follow). Names follow XPath 1.0: an unprefixed name is in no namespace. *namespaces* binds
    prefixes. Returns None when every step exists, else a message naming the first step that does not.
    """
    ns = dict(namespaces)
    steps, problem = _split_steps(path)
    if problem:
        return f"{clip(path, 200)!r}: {problem}"
    shown = clip(path, 200)
    reverse = {uri: p for p, uri in ns.items()}

    def display(qname: str) -> str:
        q = etree.QName(qname)
        if q.namespace is None:
            return q.localname
        prefix = reverse.get(q.namespace)
        return f"{prefix}:{q.localname}" if prefix else qname

    def resolve(step: str) -> str | None:
        prefix, _, local = step.rpartition(":")
        if not prefix:
            return local
        uri = ns.get(prefix)
        return None if uri is None else f"{{{uri}}}{local}"

    absolute = path.strip().startswith("/")
    roots = sorted(roots_of)
    if not roots:
        return f"{shown}: schema {name!r} declares no root element to start from"
    if absolute:
        first = steps.pop(0)
        if first in ("*", "node()"):
            return None
        qname = resolve(first)
        if qname is None:
            return f"{shown}: step 1 {first!r} uses an unbound prefix"
        if qname not in roots_of:
            hint = ""
            if ":" not in first:
                hint = " (an unprefixed name is in no namespace in XPath 1.0; bind a prefix to the document namespace)"
            return (
                f"{shown}: step 1 {first!r} is not the root element of schema {name!r}, "
                f"which is {', '.join(display(r) for r in roots)}{hint}"
            )
        current = bundle.maps.elements.get(qname)
    else:
        current = bundle.maps.elements.get(roots[0])
    if current is None:
        return f"{shown}: schema {name!r} has no element declaration for its root"
    offset = 2 if absolute else 1
    for index, step in enumerate(steps):
        number = index + offset
        last = index == len(steps) - 1
        if step == ".":
            continue
        if step in ("text()", "node()") or step.startswith("@"):
            if not last:
                return f"{shown}: step {number} {step!r} must be the last step"
            if step.startswith("@"):
                attr = step[1:]
                if attr == "*":
                    return None
                qname = resolve(attr)
                if qname is None:
                    return f"{shown}: step {number} {step!r} uses an unbound prefix"
                wildcard = current.attributes.get(None)
                if wildcard is not None and wildcard.is_matching(qname):
                    return None
                if qname not in current.attributes:
                    declared = ", ".join(sorted(display(str(a)) for a in current.attributes if a)) or "none"
                    return (
                        f"{shown}: step {number} {step!r} does not exist: element {display(current.name)} "
                        f"declares no such attribute (it declares: {clip(declared, 200)})"
                    )
            return None
        if step == "*" or step.endswith(":*"):
            return None
        qname = resolve(step)
        if qname is None:
            return f"{shown}: step {number} {step!r} uses an unbound prefix"
        children = list(current.iterchildren())
        match = next((c for c in children if isinstance(c, XsdElement) and c.name == qname), None)
        if match is None:
            if any(isinstance(c, XsdAnyElement) and c.is_matching(qname) for c in children):
                return None
            names = [display(c.name) for c in children if isinstance(c, XsdElement)]
            listing = ", ".join(names[:15]) + (", ..." if len(names) > 15 else "")
            hint = ""
            if ":" not in step:
                hint = " (an unprefixed name is in no namespace in XPath 1.0)"
            return (
                f"{shown}: step {number} {step!r} does not exist: element {display(current.name)} "
                f"has no child {display(qname)}{hint}; its children are: {listing or 'none'}"
            )
        current = match
    return None


_STEP = re.compile(r"^(?:@?(?:[A-Za-z_][\w.\-]*:)?(?:[A-Za-z_][\w.\-]*|\*)|text\(\)|node\(\)|\.)$")


def _split_steps(path: str) -> tuple[list[str], str | None]:
    """Split an XPath into its child steps, dropping predicates; or say why not."""
    text = path.strip()
    if not text or text == "/":
        return [], "the path is empty"
    bare = without_predicates(text)
    if bare is None:
        return [], "its brackets or quotes are unbalanced"
    if "//" in bare:
        return [], "'//' (descendant) steps cannot be checked; spell out each child step"
    steps = bare.strip("/").split("/")
    for step in steps:
        if step == "..":
            return [], "'..' steps cannot be checked"
        if not _STEP.match(step):
            return [], f"step {clip(step, 60)!r} is not a name step this check understands"
    return steps, None
