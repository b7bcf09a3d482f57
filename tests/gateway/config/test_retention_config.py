"""``ledger.retention`` in the configuration: every wrong value is reported at its file and line when the
configuration is loaded; rules per route win over rules per document type, which win over the default; the
command line shows the store's figures and gets archived documents back; the metrics read the store."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from gwtest import REPO

from gateway.config.loader import load_settings
from gateway.errors import ConfigError
from ledger_contract.retention import Rule

BASE = f"""
partners: {REPO / "config" / "partners.yaml"}
routes: {REPO / "routes" / "ubl-2.1.yaml"}
exchange: {{late_reply_window: 1h}}
"""


def load(tmp_path: Path, retention: str):
    path = tmp_path / "b2bgw.yaml"
    path.write_text(BASE + "ledger:\n  retention:\n" + "\n".join("    " + line for line in retention.splitlines()))
    return load_settings(path)


def error(tmp_path: Path, retention: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, retention)
    return info.value


def test_defaults_and_rules(tmp_path):
    s = load(
        tmp_path,
        "online: 30d\ndocument_types: {Invoice: 400d}\n"
        "routes: {ubl-order: {online: 7d, after: purge}, ubl-invoice: {after: purge}}",
    )
    p = s.retention
    assert p.default == Rule(30 * 86400.0, "archive")
    assert p.rule_for("ubl-order", "Order") == Rule(7 * 86400.0, "purge")
    assert p.rule_for("ubl-invoice", "Invoice") == Rule(30 * 86400.0, "purge")  # the route's rule wins
    assert p.rule_for("other", "Invoice") == Rule(400 * 86400.0, "archive")
    assert p.rule_for("other", "Order") == p.default
    assert p.tombstones == 400 * 86400.0 and p.schedule == "30 3 * * *" and p.enabled
    classes = p.classes()
    assert [c.default for c in classes] == [False, False, False, True]
    assert len({c.name for c in classes}) == 4
    # a class's name follows what it holds (the job's scan cursors are kept per name)
    again = load(
        tmp_path, "online: 30d\ndocument_types: {Invoice: 400d}\nroutes: {ubl-order: {online: 7d, after: purge}}"
    ).retention
    assert {c.name for c in again.classes()} != {c.name for c in classes}


def test_without_section_nothing_is_retained(tmp_path):
    path = tmp_path / "b2bgw.yaml"
    path.write_text(BASE)
    assert load_settings(path).retention is None


@pytest.mark.parametrize(
    "retention, line, words",
    [
        ("online: 0d", 7, "positive duration"),
        ("online: 10m", 7, "shorter than exchange.late_reply_window"),
        ("online: soon", 7, "must be a duration"),
        ("after: delete", 7, "must be one of archive, purge"),
        ("online: 30d\nroutes: {no-such-route: 10d}", 8, "not configured"),
        ("routes:\n  ubl-order: {online: 10d, keep: 1}", 8, "unknown key 'keep'"),
        ("document_types: {Invoice: {after: shred}}", 7, "must be one of archive, purge"),
        ("tombstones: 2h", 7, "at least 1d"),
        ("schedule: every night", 7, "not a crontab expression"),
        ("timezone: Mars/Olympus", 7, "not a time zone"),
        ("batch: 5", 7, "from 100 to 100000"),
        ("enabled: yes please", 7, "true or false"),
        ("keep: 90d", 7, "unknown key 'keep' in ledger.retention"),
    ],
)
def test_wrong_values_are_reported_at_their_line(tmp_path, retention, line, words):
    err = error(tmp_path, retention)
    assert err.line == line, (err.line, str(err))
    assert err.file == str(tmp_path / "b2bgw.yaml")
    assert words in str(err)


def test_forever_tombstones(tmp_path):
    assert load(tmp_path, "tombstones: forever").retention.tombstones is None


def test_sample_configuration_has_a_policy():
    p = load_settings(REPO / "config" / "b2bgw.yaml").retention
    assert p is not None and p.default.online == 90 * 86400.0 and p.default.after == "archive"


# --------------------------------------------------------------------------- the command line


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "b2bgw.yaml"
    path.write_text(
        BASE + f"store: {{url: 'sqlite:///{tmp_path / 'gw.db'}'}}\n"
        f"etl: {{enabled: false, warehouse: '{tmp_path / 'wh'}'}}\n"
        "workers: []\nledger:\n  retention: {online: 90d, tombstones: 400d}\n"
    )
    return path


def test_cli_archive_run_status_get_and_db_stats(tmp_path, capsys):
    import sys

    sys.path.insert(0, str(REPO / "tests" / "spark_etl"))
    from archivetest import fill, open_store, order

    from gateway.cli.main import main

    config = _config(tmp_path)
    broker = open_store(f"sqlite:///{tmp_path / 'gw.db'}")
    try:
        ids = fill(broker, 20, days_ago=100)
        fill(broker, 3, days_ago=1, start=100)
    finally:
        broker.close()
    assert main(["db", "stats", "-c", str(config)]) == 0
    out = capsys.readouterr().out
    assert "b2b_ledger " in out and "23 " in out.split("b2b_ledger ", 1)[1].splitlines()[0]
    assert "oldest online document: ID:test-000000" in out
    assert "due at the next run: 20 to archive and purge" in out
    assert "auto_vacuum incremental" in out

    assert main(["archive", "run", "-c", str(config)]) == 0
    assert "20 documents archived" in capsys.readouterr().out
    assert main(["archive", "status", "-c", str(config), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["runs"][0]["status"] == "succeeded" and status["runs"][0]["purged"] == 20
    assert main(["archive", "get", ids[4], "-c", str(config), "--request"]) == 0
    assert capsys.readouterr().out.encode() == order(4)
    assert main(["archive", "get", ids[4], "-c", str(config), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["record"]["message_id"] == ids[4] and [h["status"] for h in got["history"]] == ["accepted", "replied"]
    assert main(["archive", "verify", "-c", str(config)]) == 0
    assert "agree" in capsys.readouterr().out
    assert main(["archive", "get", "ID:nothing", "-c", str(config)]) == 2
    assert "not in the archive" in capsys.readouterr().err
    import sqlalchemy as sa

    from gateway.admin.tables import audit

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'gw.db'}")
    with engine.connect() as conn:  # every archive read and run is in the audit trail
        rows = conn.execute(sa.select(audit).order_by(audit.c.id)).all()
    engine.dispose()
    assert [(r.action, r.target, r.outcome) for r in rows] == [
        ("archive-run", None, "done"),
        ("archive-get", ids[4], "done"),
        ("archive-get", ids[4], "done"),
        ("archive-get", "ID:nothing", "refused"),
    ]
    assert all(r.role == "cli" for r in rows)
    assert main(["db", "stats", "-c", str(config), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["documents"]["replied"] == 3
    assert stats["retention"]["last_run"]["archived"] == 20
    assert main(["db", "vacuum", "-c", str(config)]) == 0
    assert "free pages" in capsys.readouterr().out


def test_cli_without_a_policy_says_so(tmp_path, capsys):
    from gateway.cli.main import main

    path = tmp_path / "b2bgw.yaml"
    path.write_text(BASE + f"store: {{url: 'sqlite:///{tmp_path / 'gw.db'}'}}\n")
    assert main(["archive", "run", "-c", str(path)]) == 2
    assert "no ledger.retention section" in capsys.readouterr().err
    assert main(["db", "stats", "-c", str(path)]) == 2
    assert "no store there yet" in capsys.readouterr().err


def sample(text: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return s.value
    raise AssertionError(f"no {name} in the exposition")


def test_metrics_read_the_store(tmp_path):
    import sys

    from prometheus_client import CollectorRegistry, generate_latest

    sys.path.insert(0, str(REPO / "tests" / "spark_etl"))
    from archivetest import fill, open_store, policy

    from gateway.ledger.retention_metrics import LifecycleCollector
    from spark_etl import archive

    broker = open_store(f"sqlite:///{tmp_path / 'gw.db'}")
    try:
        registry = CollectorRegistry()
        collector = LifecycleCollector(broker.engine, ttl=0)
        registry.register(collector)
        text = generate_latest(registry).decode()
        assert "b2bgw_archive_last_run_success" in text and 'b2bgw_archive_documents_total{kind="archive"} 0.0' in text
        fill(broker, 15, days_ago=100)
        fill(broker, 2, days_ago=2, start=50)
        archive.run(
            policy(),
            engine=broker.engine,
            write=archive.store_writer(broker),
            root=str(tmp_path / "wh"),
            wait_for_warehouse=False,
        )
        text = generate_latest(registry).decode()
        assert "b2bgw_archive_last_run_success 1.0" in text
        assert 'b2bgw_archive_last_run_documents{outcome="purged"} 15.0' in text
        assert 'b2bgw_archive_documents_total{kind="archive"} 15.0' in text
        assert "b2bgw_ledger_tombstones 15.0" in text
        age = sample(text, "b2bgw_ledger_oldest_final_age_seconds")
        assert 2 * 86400 - 60 < age < 2 * 86400 + 3600
        assert sample(text, "b2bgw_archive_bytes_total") > 0
        assert time.time() - sample(text, "b2bgw_archive_last_run_timestamp_seconds") < 60
    finally:
        broker.close()
