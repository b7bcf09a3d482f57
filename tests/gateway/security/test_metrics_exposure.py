"""``/metrics`` names partners and counts their requests: on the partner port only for operators, or for
anyone only when configured so. On a real server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from gwtest import GLOBEX, INVOICE, with_id
from sectest import RealServer

from gateway.http.app import create_app
from gateway.routing.partners import hash_key
from gateway.runtime.serving import Runtime


@contextmanager
def serving(make_assembly, **changes) -> Iterator[RealServer]:
    assembly = make_assembly(**changes)
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    try:
        with RealServer(create_app(assembly, runtime=runtime)) as server:
            r = httpx.post(server.base + "/v1/documents", content=with_id(INVOICE, "MET-1"), headers=GLOBEX, timeout=60)
            assert r.status_code == 202
            yield server
    finally:
        runtime.stop()


def test_no_metrics_on_the_partner_port_by_default(make_assembly):
    with serving(make_assembly) as server:
        r = httpx.get(server.base + "/metrics", timeout=30)
        assert r.status_code == 404
        assert "globex" not in r.text


def test_where_the_admin_side_shares_the_port_metrics_are_for_operators(make_assembly):
    operators = {"vera": {"role": "viewer", "hash": hash_key("vera-secret-1", ln=4)}}
    with serving(make_assembly, operators=operators) as server:
        refused = httpx.get(server.base + "/metrics", timeout=30)
        assert refused.status_code == 401 and "globex" not in refused.text
        assert refused.headers["www-authenticate"].lower().startswith("basic")
        partner = httpx.get(server.base + "/metrics", headers={"Authorization": GLOBEX["Authorization"]}, timeout=30)
        assert partner.status_code == 401  # a partner key never opens it
        ok = httpx.get(server.base + "/metrics", auth=("vera", "vera-secret-1"), timeout=30)
        assert ok.status_code == 200 and 'partner="globex"' in ok.text


def test_served_to_anyone_only_when_configured_so(make_assembly):
    with serving(make_assembly, admin={"metrics_on_partner_port": True}) as server:
        r = httpx.get(server.base + "/metrics", timeout=30)
        assert r.status_code == 200 and 'partner="globex"' in r.text
