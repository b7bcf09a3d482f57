"""``b2bgw deliver`` queues a document for a partner's endpoint; ``b2bgw deliveries`` shows it pending, then
``deliveries show`` its row; a wrong endpoint is one clear line."""

from __future__ import annotations

import base64
import json
import os

import yaml
from gwtest import sample_data

from gateway.cli import main as cli

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()


def test_deliver_then_deliveries(tmp_path, capsys, monkeypatch):
    data = json.loads(json.dumps(sample_data(tmp_path)))
    data["partners"]["acme"]["endpoints"] = {"main": {"url": "https://partner.example/hook", "secrets": [SECRET]}}
    config = tmp_path / "b2bgw.yaml"
    config.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    document = tmp_path / "invoice.xml"
    document.write_bytes(b"<Invoice><ID>CLI-1</ID></Invoice>")

    assert cli.main(["deliver", "--config", str(config), "--partner", "acme", str(document)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("queued ID:") and "acme/main" in out
    delivery_id = out.split()[1]

    assert cli.main(["deliveries", "--config", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["PARTNER/ENDPOINT", "PENDING", "IN-FLIGHT", "FAILING-SINCE", "DEAD"]
    assert lines[1].split() == ["acme/main", "1", "0", "-", "0"]

    assert cli.main(["deliveries", "show", "--config", str(config), delivery_id]) == 0
    assert "acme/main  pending  source cli:" in capsys.readouterr().out

    code = cli.main(["deliver", "--config", str(config), "--partner", "acme", "--endpoint", "nope", str(document)])
    err = capsys.readouterr().err
    assert code == 2 and "has no endpoint 'nope'" in err and len(err.strip().splitlines()) == 1
