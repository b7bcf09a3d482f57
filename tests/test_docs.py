"""The partner guide documents every answer a partner can get: each problem code the gateway's partner-facing
errors carry is in its table."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import GatewayError

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "partner-guide.md"


def _partner_codes() -> set[str]:
    found, pending = set(), [GatewayError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.partner_facing and not cls.__name__.startswith("_") and cls.__module__ == "gateway.errors":
            found.add(cls.code)
    return found


@pytest.mark.parametrize("code", sorted(_partner_codes()))
def test_the_partner_guide_lists_every_problem_code(code):
    assert f"`{code}`" in GUIDE.read_text(), f"docs/partner-guide.md does not document the problem code {code!r}"
