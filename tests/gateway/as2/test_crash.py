"""Crash safety: ``kill -9`` after the document is committed and before the MDN is sent. The partner's resend
(same Message-ID, same content) gets its MDN from the restarted gateway, and the document is in the ledger
once (the ledger insert and the enqueue are one transaction, so once in the ledger is once enqueued)."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from as2kit import OUR_ID, as2_headers, cms_encrypt, cms_sign, disposition_of, entity, openssl_verify_mdn, to_http
from gwtest import INVOICE, REPO, SAMPLE_CONFIG

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


def _config(tmp_path: Path, pki) -> Path:
    partners = tmp_path / "partners.yaml"
    text = (REPO / "config" / "partners.yaml").read_text()
    text = text.replace(
        "  globex:\n    name: Globex Supplies (supplier)\n",
        f"  globex:\n    name: Globex Supplies (supplier)\n    as2:\n      id: GLOBEX-AS2\n"
        f"      certificate: {pki.globex.cert}\n",
        1,
    )
    assert "GLOBEX-AS2" in text
    partners.write_text(text)
    config = tmp_path / "b2bgw.yaml"
    config.write_text(
        SAMPLE_CONFIG.read_text()
        .replace("partners: partners.yaml", f"partners: {partners}")
        .replace("routes: ../routes/ubl-2.1.yaml", f"routes: {REPO}/routes/ubl-2.1.yaml")
        .replace("file: ../rules/", f"file: {REPO}/rules/")
        + f"\nas2:\n  id: {OUR_ID}\n  key: {pki.ours.key}\n  certificate: {pki.ours.cert}\n"
    )
    return config


def _serve(tmp_path: Path, config: Path, script: list[str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "B2BGW_STORE_URL": f"sqlite:///{tmp_path / 'gw.db'}", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            *script,
            "serve",
            "--config",
            str(config),
            "--port",
            str(port),
            "--no-etl",
            "--no-stomp",
            "--no-access-log",
            "--no-workers",
        ],
        cwd=str(tmp_path),
        env=env,
        stdout=(tmp_path / "serve.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server did not become ready")


def test_a_resend_after_a_kill_between_commit_and_mdn_gets_the_mdn_once(tmp_path, as2_pki):
    config = _config(tmp_path, as2_pki)
    headers, body = to_http(cms_encrypt(cms_sign(entity(INVOICE), as2_pki.globex), as2_pki.ours))
    headers = {**as2_headers("GLOBEX-AS2"), **headers}
    proc, base = _serve(tmp_path, config, [str(HERE / "crash_serve.py")])
    try:
        with pytest.raises(httpx.HTTPError):  # the server dies before it answers
            httpx.post(f"{base}/as2", content=body, headers=headers, timeout=60)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    with sqlite3.connect(tmp_path / "gw.db") as db:  # committed before the kill
        assert db.execute("select count(*) from b2b_ledger").fetchone()[0] == 1
        assert db.execute("select count(*) from b2b_as2_messages").fetchone()[0] == 0
    proc, base = _serve(tmp_path, config, ["-m", "gateway.cli.main"])
    try:
        response = httpx.post(f"{base}/as2", content=body, headers=headers, timeout=60)
        report = openssl_verify_mdn(response.headers["content-type"], response.content, as2_pki.ours.cert)
        assert disposition_of(report) == "automatic-action/MDN-sent-automatically; processed"
        again = httpx.post(f"{base}/as2", content=body, headers=headers, timeout=60)
        assert again.content == response.content
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    with sqlite3.connect(tmp_path / "gw.db") as db:
        assert db.execute("select count(*) from b2b_ledger").fetchone()[0] == 1
        ledger_id = db.execute("select message_id from b2b_ledger").fetchone()[0]
        assert db.execute("select message_id, disposition from b2b_as2_messages").fetchall() == [
            (ledger_id, "processed")
        ]
    assert ledger_id.encode() in report
