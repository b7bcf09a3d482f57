"""A refused document is let go when its answer is: no frame of the gateway's (holding the body, its tree,
its error report) waits in a reference cycle for the garbage collector, which would free it later in
whatever thread collects next (the event loop, the store's writer) and keep up to ``limits.max_bytes`` per
refusal alive meanwhile."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest
from exchange.test_intake_workers import REFUSED, ready
from gwtest import ACME, GLOBEX, ORDER, with_id

import gateway as gateway_package
from gateway.errors import GatewayError

pytestmark = pytest.mark.anyio

OURS = str(Path(gateway_package.__file__).resolve().parent)
ACME_ID, GLOBEX_ID = "acme", "globex"
SMALL_INVALID = with_id(ORDER, "GC-1").replace(b"<cbc:ID>GC-1</cbc:ID>", b"<cbc:ID>GC-1</cbc:ID><cbc:Bogus/>", 1)


def cyclic_frames() -> list[str]:
    """The gateway's frames among the garbage a collection finds now."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
    finally:
        gc.set_debug(0)
    found = [
        f"{o.f_code.co_name} ({Path(o.f_code.co_filename).name})"
        for o in gc.garbage
        if type(o).__name__ == "frame" and o.f_code.co_filename.startswith(OURS)
    ]
    gc.garbage.clear()
    return found


@pytest.fixture
def no_collection():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("explain", [True, False], ids=["full-report", "libxml2-report"])
async def test_a_refused_document_leaves_no_cycle_behind(gw_env, no_collection, monkeypatch, explain):
    gateway = gw_env.gateway
    if not explain:
        monkeypatch.setattr(gateway.intake, "explainer", None)
    await ready(gateway)
    refused = [("small schema", ACME_ID, SMALL_INVALID), ("small route", GLOBEX_ID, SMALL_INVALID)]
    refused += [(f"large {name}", ACME_ID if name == "route" else GLOBEX_ID, body) for name, body in REFUSED.items()]
    left = {}
    for name, partner, body in refused:
        cyclic_frames()
        with pytest.raises(GatewayError):
            await gateway.submit(gateway.partners.get(partner), body)
        await asyncio.sleep(0)
        left[name] = cyclic_frames()
    assert left == {name: [] for name, _, _ in refused}


async def test_a_refusal_over_http_leaves_no_cycle_behind(gw_env, no_collection):
    await ready(gw_env.gateway)
    cyclic_frames()
    for headers, body in (
        (ACME, SMALL_INVALID),
        (GLOBEX, SMALL_INVALID),
        (GLOBEX, REFUSED["schema"]),
        (GLOBEX, REFUSED["well-formed"]),
    ):
        response = await gw_env.client.post("/v1/documents", content=body, headers=headers)
        assert response.status_code in (400, 403)
    await asyncio.sleep(0)
    assert cyclic_frames() == []
