"""Fixtures of the gateway's HTTP-level tests (config, app, ledger, CLI...).

``gw_registry``: the UBL schemas of the sample configuration, compiled once per
session (~2 s) and shared by every gateway built in the tests.
``gw_env``: a gateway on a fresh SQLite store in ``tmp_path`` with the sample
partners and routes (timeouts shortened), its runtime started, an
``httpx.AsyncClient`` on the ASGI app, and an in-test order responder thread
whose behaviour a test sets (reply, delay, error, silence).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gwtest import SAMPLE_CONFIG, GatewayEnv, Responder, sample_data

from gateway.config.loader import load_settings, settings_from_mapping
from gateway.exchange.assemble import Assembly, assemble, build_registry
from gateway.http.app import create_app
from gateway.intake.schemas import SchemaRegistry
from gateway.runtime.serving import Runtime


@pytest.fixture(scope="session")
def gw_registry() -> SchemaRegistry:
    errors: list[Any] = []
    registry = build_registry(load_settings(SAMPLE_CONFIG), errors)
    assert not errors
    return registry


@pytest.fixture
def make_assembly(gw_registry, tmp_path) -> Callable[..., Assembly]:
    def make(data: Any = None, **changes: Any) -> Assembly:
        if data is None:
            data = sample_data(tmp_path, **changes)
        settings = settings_from_mapping(data, config_path=SAMPLE_CONFIG, base_dir=tmp_path)
        assembly = assemble(settings, registry=gw_registry)
        assert not assembly.errors, assembly.errors
        return assembly

    return make


@pytest.fixture
async def gw_env(make_assembly) -> Iterator[GatewayEnv]:
    assembly = make_assembly()
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=True)
    runtime.start()
    responder = Responder(runtime.broker).start()
    app = create_app(assembly, runtime=runtime)
    transport = httpx.ASGITransport(app=app)
    client = httpx.AsyncClient(transport=transport, base_url="http://gw.test")
    try:
        yield GatewayEnv(assembly, runtime, app, client, responder)
    finally:
        await client.aclose()
        responder.stop()
        runtime.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def gw_sync(make_assembly) -> Iterator[Any]:
    """A started runtime and a Starlette TestClient on its app (for sync tests, hypothesis)."""
    import warnings

    with warnings.catch_warnings():  # starlette 1.x nags about httpx; the client works as is
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    assembly = make_assembly()
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    responder = Responder(runtime.broker).start()
    app = create_app(assembly, runtime=runtime)
    client = TestClient(app, raise_server_exceptions=True)
    try:
        yield client, runtime, responder
    finally:
        client.close()
        responder.stop()
        runtime.stop()
