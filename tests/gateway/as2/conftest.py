"""Fixtures of the AS2 tests: a gateway with an ``as2:`` section and two AS2 partners, its certificates
made with the openssl command line.

``globex`` (AS2 id ``GLOBEX-AS2``, one-way Invoice route) must sign and encrypt; ``acme`` (``ACME-AS2``,
request-reply Order route) must sign, need not encrypt, and may use 3DES.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from as2kit import As2Pki, as2_data, make_pki
from gwtest import GatewayEnv, Responder

from gateway.http.app import create_app
from gateway.runtime.serving import Runtime


@pytest.fixture(scope="session")
def as2_pki(tmp_path_factory) -> As2Pki:
    folder = tmp_path_factory.mktemp("as2-pki")
    return As2Pki(
        make_pki(folder, "ours"),
        make_pki(folder, "globex"),
        make_pki(folder, "acme"),
        make_pki(folder, "stranger"),
        folder,
    )


async def _env(make_assembly, data) -> Iterator[GatewayEnv]:
    assembly = make_assembly(data)
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=True)
    runtime.start()
    responder = Responder(runtime.broker).start()
    app = create_app(assembly, runtime=runtime)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test", timeout=30)
    try:
        yield GatewayEnv(assembly, runtime, app, client, responder)
    finally:
        await client.aclose()
        responder.stop()
        runtime.stop()


@pytest.fixture
async def as2_env(make_assembly, tmp_path, as2_pki) -> Iterator[GatewayEnv]:
    async for env in _env(make_assembly, as2_data(tmp_path, as2_pki)):
        yield env


@pytest.fixture
def as2_env_factory(make_assembly, tmp_path, as2_pki):
    """Make an env from changed AS2 data (``async for env in factory(data)``)."""

    def make(data):
        return _env(make_assembly, data)

    return make
