"""Keys rotated while serving: the partners file changed under ``b2bgw serve --processes 2`` on PostgreSQL, a
second key added, both used, the first revoked: refused by every process within 5 s, the other still
working, no restart. ``b2bgw partners`` lists what expires."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

import httpx
import pytest
import yaml
from gwtest import sample_data
from trust_helpers import Served, plain

from gateway.cli import main as cli
from gateway.routing.partners import generate_key, hash_key


def _write_partners(path: Path, entries: list[dict]) -> None:
    data = {
        "partners": {
            "acme": {"name": "Acme", "keys": entries},
            "globex": {"name": "Globex", "keys": [{"id": "globex-1", "hash": hash_key(generate_key("globex-1"))}]},
        }
    }
    tmp = path.with_suffix(".new")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, path)  # as an editor or a deployment tool writes it: the whole file at once


def _status(base: str, key: str) -> int:
    with httpx.Client(timeout=30) as c:  # a new connection each time: the kernel spreads them over the processes
        return c.get(f"{base}/v1/documents/ID:none", headers={"Authorization": f"Bearer {key}"}).status_code


def _until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.postgres
def test_revoked_key_refused_by_every_process_within_5_s(tmp_path, postgres_schema):
    assert cli.main(["db", "upgrade", "--url", postgres_schema]) == 0
    first, second = generate_key("acme-1"), generate_key("acme-2")
    entry1 = {"id": "acme-1", "hash": hash_key(first), "label": "2026"}
    entry2 = {"id": "acme-2", "hash": hash_key(second), "label": "2027"}
    partners = tmp_path / "partners.yaml"
    _write_partners(partners, [entry1])
    data = plain(sample_data(tmp_path))
    data["partners"] = "partners.yaml"
    data["store"]["url"] = postgres_schema
    data["server"] = {**data.get("server", {}), "partners_reload": "500ms"}
    config = tmp_path / "b2bgw.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    server = Served(tmp_path, config, "--processes", "2", "--no-workers", scheme="http", store_url=postgres_schema)
    try:
        server.wait_ready()
        assert _status(server.base, first) == 404  # authenticated: the document is not found
        assert _status(server.base, second) == 401

        _write_partners(partners, [entry1, entry2])
        assert _until(lambda: all(_status(server.base, second) == 404 for _ in range(10)), 30), (
            "the added key was not accepted by every process"
        )
        assert all(_status(server.base, first) == 404 for _ in range(10))

        _write_partners(partners, [entry2])
        revoked_at = time.monotonic()
        time.sleep(max(0.0, 5.0 - (time.monotonic() - revoked_at)))
        refused = [_status(server.base, first) for _ in range(20)]
        assert refused == [401] * 20, refused
        assert all(_status(server.base, second) == 404 for _ in range(20))
        log = server.log.read_text(errors="replace")
        assert log.count("partners reloaded from") >= 4  # two changes, seen by each of the two processes
        assert "removed ['acme-1']" in log
    finally:
        server.stop()


def test_a_broken_partners_file_keeps_the_previous_partners(tmp_path):

    from gateway.config.loader import load_settings
    from gateway.routing.partners import PartnerRegistry
    from gateway.runtime.partners_watch import PartnersWatcher

    key = generate_key("acme-1")
    partners = tmp_path / "partners.yaml"
    _write_partners(partners, [{"id": "acme-1", "hash": hash_key(key)}])
    data = plain(sample_data(tmp_path))
    data["partners"] = "partners.yaml"
    config = tmp_path / "b2bgw.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    settings = load_settings(config)
    registry = PartnerRegistry.from_settings(settings)
    watcher = PartnersWatcher(settings, registry)
    partners.write_text("partners: {acme: {keys: [{id: acme-1, hash: not-a-hash}]}}\n")
    assert watcher.check() is False
    assert registry.authenticate(f"Bearer {key}").id == "acme"
    _write_partners(partners, [])
    assert watcher.check() is True
    with pytest.raises(Exception) as caught:
        registry.authenticate(f"Bearer {key}")
    assert getattr(caught.value, "status", None) == 401


def test_partners_command_lists_expiries(tmp_path, capsys):
    now = dt.datetime.now(dt.UTC)
    partners = tmp_path / "partners.yaml"
    _write_partners(
        partners,
        [
            {
                "id": "acme-old",
                "hash": hash_key(generate_key("acme-old")),
                "label": "old",
                "not_after": (now - dt.timedelta(days=2)).isoformat(),
            },
            {
                "id": "acme-soon",
                "hash": hash_key(generate_key("acme-soon")),
                "label": "soon",
                "not_after": (now + dt.timedelta(days=10)).isoformat(),
            },
            {
                "id": "acme-later",
                "hash": hash_key(generate_key("acme-later")),
                "not_after": (now + dt.timedelta(days=200)).isoformat(),
            },
        ],
    )
    data = plain(sample_data(tmp_path))
    data["partners"] = "partners.yaml"
    config = tmp_path / "b2bgw.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    assert cli.main(["partners", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[1]: line for line in out.splitlines() if line.startswith("  key")}
    assert "EXPIRED" in lines["acme-old"]
    assert "EXPIRES in" in lines["acme-soon"] and "[soon]" in lines["acme-soon"]
    assert "days left" in lines["acme-later"]
    assert "no expiry" in lines["globex-1"]


def test_expiry_metric_and_warning(tmp_path, caplog):
    from gateway.config.loader import settings_from_mapping
    from gateway.routing.partners import PartnerRegistry
    from gateway.telemetry.metrics import REGISTRY
    from gateway.trust.expiry import ExpiryWatch

    now = dt.datetime.now(dt.UTC)
    data = plain(sample_data(tmp_path))
    data["partners"]["acme"]["keys"].append(
        {
            "id": "acme-soon",
            "hash": hash_key(generate_key("acme-soon")),
            "not_after": (now + dt.timedelta(days=5)).isoformat(),
        }
    )
    data["partners"]["acme"]["keys"].append(
        {
            "id": "acme-far",
            "hash": hash_key(generate_key("acme-far")),
            "not_after": (now + dt.timedelta(days=300)).isoformat(),
        }
    )
    registry = PartnerRegistry.from_settings(settings_from_mapping(data, base_dir=tmp_path))
    with caplog.at_level("WARNING", logger="gateway.trust.expiry"):
        soon = ExpiryWatch(registry, 30).check(now)
    assert [c.name for c in soon] == ["acme-soon"]
    assert "acme-soon expires on" in caplog.text and "acme-far" not in caplog.text
    value = REGISTRY.get_sample_value(
        "b2bgw_credential_expiry_seconds", {"partner": "acme", "kind": "key", "name": "acme-soon"}
    )
    assert value is not None and 4 * 86400 < value <= 5 * 86400
