"""Tests of gateway.config.loader: the YAML configuration, with file and line in every error."""

from __future__ import annotations

from pathlib import Path

import pytest
from gwtest import SAMPLE_CONFIG

from gateway.config.loader import (
    DEFAULT_STORE_URL,
    Where,
    load_settings,
    load_yaml,
    parse_duration,
    settings_from_mapping,
)
from gateway.errors import ConfigError


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_sample_configuration_loads():
    s = load_settings(SAMPLE_CONFIG)
    assert s.store_url == DEFAULT_STORE_URL == "sqlite:///var/b2bgw.db"
    assert s.port == 8080 and s.host == "127.0.0.1"
    assert s.limits.max_bytes == 10 * 1024 * 1024
    assert set(s.ubl_documents) == {
        "Order",
        "OrderResponse",
        "OrderChange",
        "OrderCancellation",
        "DespatchAdvice",
        "Invoice",
    }
    assert set(s.partners) == {"acme", "globex"}
    assert [r["id"] for r in s.routes] == [
        "ubl-order",
        "ubl-order-change",
        "ubl-order-cancellation",
        "ubl-despatch-advice",
        "ubl-invoice",
    ]
    assert s.workers == ["gateway.samples.order_responder", "gateway.samples.document_receiver"]
    assert s.worker_concurrency == {"gateway.samples.order_responder": 4}
    assert s.etl["schedule"] == "0 2 * * *"  # passed through untouched
    assert s.late_reply_window == 3600 and s.reconcile_interval == 2
    # entries remember where they are, in the file they come from
    assert s.routes.where.file.endswith("ubl-2.1.yaml")
    assert s.routes.at(0).line is not None and s.partners.at("globex").file.endswith("partners.yaml")


def test_yaml_syntax_error_has_file_and_line(tmp_path):
    path = write(tmp_path, "b.yaml", "store:\n  url: sqlite:///x\nserver: [1, 2\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert info.value.file == str(path) and info.value.line in (3, 4)
    assert str(info.value).startswith(f"{path}:")


def test_duplicate_keys_are_refused_with_both_lines(tmp_path):
    path = write(tmp_path, "b.yaml", "server:\n  port: 1\n  host: a\n  port: 2\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert info.value.line == 4 and "first at line 2" in info.value.detail


def test_unknown_keys_and_wrong_types_point_at_their_line(tmp_path):
    path = write(tmp_path, "b.yaml", "server:\n  host: a\n  prot: 80\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert info.value.line == 3 and "prot" in info.value.detail
    path = write(tmp_path, "c.yaml", "limits:\n  max_body_bytes: ten\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert info.value.line == 2
    path = write(tmp_path, "d.yaml", "\n\nbogus: 1\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert info.value.line == 3


def test_section_files_report_their_own_file(tmp_path):
    write(tmp_path, "routes.yaml", "routes:\n  - id: a\n  - id: b\n")
    write(tmp_path, "partners.yaml", "just text\n")
    main = write(tmp_path, "b.yaml", "partners: partners.yaml\nroutes: routes.yaml\n")
    with pytest.raises(ConfigError) as info:
        load_settings(main)
    assert info.value.file == str(main) and "partners must be a mapping" in info.value.detail
    main = write(tmp_path, "c.yaml", "routes: routes.yaml\n")
    s = load_settings(main)
    assert s.routes.at(1) == Where(str(tmp_path / "routes.yaml"), 3)
    missing = write(tmp_path, "d.yaml", "routes: nowhere.yaml\n")
    with pytest.raises(ConfigError) as info:
        load_settings(missing)
    assert info.value.file == str(tmp_path / "nowhere.yaml") and "no such file" in info.value.detail


def test_inline_sections_and_defaults(tmp_path):
    data = load_yaml(
        text="partners: {}\nroutes: []\nworkers: [a.b]\netl: {enabled: false}\nstomp: {port: 61613}\n",
        name="inline.yaml",
    )
    s = settings_from_mapping(data, base_dir=tmp_path)
    assert s.routes == [] and s.workers == ["a.b"] and s.etl == {"enabled": False}
    assert s.stomp == {"port": 61613}  # reserved, passed through
    with pytest.raises(ConfigError) as info:
        settings_from_mapping(load_yaml(text="workers: [not a module]\n", name="w.yaml"), base_dir=tmp_path)
    assert info.value.file == "w.yaml" and info.value.line == 1


def test_store_url_can_come_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("B2BGW_STORE_URL", "sqlite:////tmp/elsewhere.db")
    assert settings_from_mapping({}, base_dir=tmp_path).store_url == "sqlite:////tmp/elsewhere.db"


def test_store_options_are_checked_at_load_with_the_line_of_the_option(tmp_path):
    """An operator's typo in store.options is a configuration error at its line (so `routes check`
    finds it), not a traceback when the store opens, nor a value taken for another."""
    for text, line, words in [
        ("store:\n  options:\n    max_deliveries: 5\n    local_wakeups: 'no'\n", 4, "true or false, not 'no'"),
        ("store:\n  options:\n    prefetch: abc\n", 3, "prefetch must be a whole number"),
        ("store:\n  options:\n    commit_delay: 0.5\n", 3, "from 0 to 0.1 s (0 turns it off), not 0.5"),
        ("store:\n  options:\n    max_delivery: 5\n", 3, "unknown option max_delivery for the SQL store"),
        ("store:\n  url: memory://\n  options:\n    pool_size: 2\n", 4, "for the memory store"),
    ]:
        with pytest.raises(ConfigError) as info:
            settings_from_mapping(load_yaml(text=text, name="s.yaml"), base_dir=tmp_path)
        assert (info.value.file, info.value.line) == ("s.yaml", line), text
        assert info.value.detail.startswith("store.options: ") and words in info.value.detail, info.value.detail
    good = "store:\n  options:\n    sqlite_synchronous: normal\n    max_deliveries: 2\n"
    assert settings_from_mapping(load_yaml(text=good, name="s.yaml"), base_dir=tmp_path).store_options == {
        "sqlite_synchronous": "normal",
        "max_deliveries": 2,
    }


@pytest.mark.parametrize(
    "section, line, words",
    [
        ("stomp:\n  port: abc\n", 2, "stomp.port must be an integer"),
        ("stomp:\n  port: 70000\n", 2, "from 0 to 65535"),
        ("stomp:\n  enabled: 'no'\n", 2, "stomp.enabled must be true or false"),
        ("stomp:\n  heartbeat: [5]\n", 2, "[send_ms, receive_ms]"),
        ("stomp:\n  heartbeat: [5, -1]\n", 2, "heartbeat interval"),
        ("stomp:\n  users:\n    1234: {passcode_file: p}\n", 3, "quote one that YAML reads as a number"),
        ("stomp:\n  users:\n    erp: '1234'\n", 3, "passcodes are not kept in the configuration"),
        ("stomp:\n  users:\n    erp: {consume: [/queue/a]}\n", 3, "needs one of passcode_hash"),
        ("stomp:\n  users:\n    erp: {passcode_hash: secret}\n", 3, "passcode_hash must be 'scrypt$"),
        ("stomp:\n  users:\n    erp:\n      passcode_file: p\n      send: [orders]\n", 5, "must start with /queue/"),
        (
            "stomp:\n  users:\n    erp:\n      passcode_file: p\n      consume: [/queue/a.>.b]\n",
            5,
            "'>' may only be the last",
        ),
        ("stomp:\n  users:\n    erp: {passcode_file: p, sned: []}\n", 3, "unknown key 'sned' in stomp.users.erp"),
        ("stomp:\n  limits:\n    connections: 0\n", 3, "stomp.limits.connections must be at least 1"),
        ("stomp:\n  limits:\n    connect_timeout: soon\n", 3, "positive number of seconds"),
        ("stomp:\n  limits:\n    memory: 5\n", 3, "unknown key 'memory' in stomp.limits"),
        ("stomp:\n  host: 127.0.0.1\n  prefetch: 0\n", 3, "stomp.prefetch must be at least 1"),
        ("stomp:\n  max_frame_size: 10\n", 2, "at least 1024"),
        ("stomp:\n  prot: 61613\n", 2, "unknown key 'prot' in stomp"),
        ("etl:\n  schedule: whenever\n", 2, "etl.schedule: must be a crontab expression"),
        ("etl:\n  schedule: '0 2 * *'\n", 2, "etl.schedule: must be a crontab expression"),
        ("etl:\n  timezone: Mars/Base\n", 2, "etl.timezone: must be an IANA time zone name"),
        ("etl:\n  enabled: 'no'\n", 2, "etl.enabled: must be true or false"),
        ("etl:\n  warehouse: ./w\n  lock_ttl: 0\n", 3, "etl.lock_ttl: must be a number of seconds over 0"),
        ("etl:\n  read_partitions: 2.5\n", 2, "whole number"),
        ("etl:\n  arrow_staging: sometimes\n", 2, "auto, true or false"),
        ("etl:\n  spark_conf: [a]\n", 2, "mapping of Spark settings"),
        ("etl:\n  shedule: '0 2 * * *'\n", 2, "unknown etl setting 'shedule'"),
    ],
)
def test_stomp_and_etl_sections_are_checked_at_load_with_lines(tmp_path, section, line, words):
    """Checked when the configuration loads (and by `routes check`), not when the listener
    starts or the night comes."""
    with pytest.raises(ConfigError) as info:
        settings_from_mapping(load_yaml(text=section, name="x.yaml"), base_dir=tmp_path)
    assert (info.value.file, info.value.line) == ("x.yaml", line)
    assert words in info.value.detail, info.value.detail


def test_good_stomp_and_etl_sections_are_kept_as_written(tmp_path):
    text = (
        "stomp:\n  enabled: true\n  port: 61614\n  users: {erp: {passcode_file: erp.pass, send: [/queue/a.*]}}\n"
        "  heartbeat: [0, 5000]\n  limits: {connections: 10, send_wait: 2.5}\n"
        "etl:\n  schedule: '30 3 * * 1-5'\n  timezone: Europe/Stockholm\n  arrow_staging: auto\n"
        "  spark_conf: {spark.driver.memory: 2g}\n"
    )
    s = settings_from_mapping(load_yaml(text=text, name="x.yaml"), base_dir=tmp_path)
    assert s.stomp == {
        "enabled": True,
        "port": 61614,
        "heartbeat": [0, 5000],
        "users": {
            "erp": {"passcode_file": str(tmp_path / "erp.pass"), "consume": [], "browse": [], "send": ["/queue/a.*"]}
        },
        "limits": {"connections": 10, "send_wait": 2.5},
    }
    assert s.etl["schedule"] == "30 3 * * 1-5" and s.etl["timezone"] == "Europe/Stockholm"


def test_limits_are_checked(tmp_path):
    data = load_yaml(text="limits:\n  max_depth: 1000\n", name="l.yaml")
    with pytest.raises(ConfigError) as info:
        settings_from_mapping(data, base_dir=tmp_path)
    assert "256" in info.value.detail


@pytest.mark.parametrize(
    "value, seconds",
    [
        (10, 10.0),
        (0.5, 0.5),
        ("250ms", 0.25),
        ("10s", 10.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("7d", 604800.0),
        ("1.5s", 1.5),
        ("3", 3.0),
    ],
)
def test_durations(value, seconds):
    assert parse_duration(value, Where("f", 1), "x") == seconds


@pytest.mark.parametrize("value", ["soon", "-1s", -1, True, None, "10 parsecs", [1]])
def test_bad_durations(value):
    with pytest.raises(ConfigError) as info:
        parse_duration(value, Where("f.yaml", 7), "timeout")
    assert info.value.line == 7 and "timeout" in info.value.detail
