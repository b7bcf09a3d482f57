"""``b2bgw as2 keys new`` and ``b2bgw as2 cert PARTNER``: the files and what is printed, read back with the
openssl command line."""

from __future__ import annotations

import stat

from as2kit import OUR_ID, run
from gwtest import REPO, SAMPLE_CONFIG

from gateway.cli.main import main


def test_keys_new_writes_a_private_key_and_its_self_signed_certificate(tmp_path, capsys):
    out = tmp_path / "as2"
    assert main(["as2", "keys", "new", "--id", "OUR-AS2", "--out", str(out), "--days", "10", "--bits", "2048"]) == 0
    key, cert = out / "as2-key.pem", out / "as2-cert.pem"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert b"CN = OUR-AS2" in run("openssl", "x509", "-in", str(cert), "-noout", "-subject")
    modulus = run("openssl", "x509", "-in", str(cert), "-noout", "-modulus")
    assert modulus == run("openssl", "rsa", "-in", str(key), "-noout", "-modulus")
    printed = capsys.readouterr().out
    assert f"as2:\n  id: OUR-AS2\n  key: {key}\n  certificate: {cert}" in printed
    # never replaced without --force
    assert main(["as2", "keys", "new", "--id", "OUR-AS2", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err


def test_cert_prints_what_the_partner_needs(tmp_path, capsys, as2_pki):
    partners = tmp_path / "partners.yaml"
    partners.write_text(
        (REPO / "config" / "partners.yaml")
        .read_text()
        .replace(
            "  globex:\n    name: Globex Supplies (supplier)\n",
            f"  globex:\n    name: Globex Supplies (supplier)\n    as2:\n      id: GLOBEX-AS2\n"
            f"      certificate: {as2_pki.globex.cert}\n",
            1,
        )
    )
    config = tmp_path / "b2bgw.yaml"
    config.write_text(
        SAMPLE_CONFIG.read_text()
        .replace("partners: partners.yaml", f"partners: {partners}")
        .replace("routes: ../routes/ubl-2.1.yaml", f"routes: {REPO}/routes/ubl-2.1.yaml")
        .replace("file: ../rules/", f"file: {REPO}/rules/")
        + f"\nas2:\n  id: {OUR_ID}\n  key: {as2_pki.ours.key}\n  certificate: {as2_pki.ours.cert}\n"
    )
    assert main(["as2", "cert", "globex", "-c", str(config), "--url", "https://b2b.example/as2"]) == 0
    printed = capsys.readouterr().out
    assert f"Our AS2 id (your AS2-To):       {OUR_ID}" in printed and "GLOBEX-AS2" in printed
    assert "https://b2b.example/as2" in printed
    pem = printed[printed.index("-----BEGIN CERTIFICATE-----") :]
    assert pem.strip() == as2_pki.ours.cert.read_text().strip()
    assert main(["as2", "cert", "acme", "-c", str(config)]) == 2  # acme has no as2: entry
    assert "no `as2:` entry" in capsys.readouterr().err
