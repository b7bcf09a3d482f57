"""Helpers of the trust tests: certificates made with trustme, a configuration with ``server.tls`` and
partners that pin them, and ``b2bgw serve`` started on it in a subprocess."""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trustme
import yaml
from gwtest import ACME_KEY, GLOBEX_KEY, REPO, sample_data

from gateway.routing.partners import generate_key, hash_key


def plain(value: Any) -> Any:
    """A marked mapping as plain dicts and lists (what yaml.safe_dump writes)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Pki:
    """The test's certificates, each written to a PEM file under ``dir``."""

    dir: Path
    ca: trustme.CA
    other_ca: trustme.CA
    server: trustme.LeafCert
    files: dict[str, Path]

    def client(self, name: str) -> Path:
        """The PEM file of client *name* (its certificate and private key)."""
        return self.files[name]


def make_pki(tmp: Path) -> Pki:
    tmp.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="B2B test CA")
    other = trustme.CA(organization_name="Another CA")
    server = ca.issue_cert("127.0.0.1", "localhost")
    files: dict[str, Path] = {}

    def write(name: str, leaf: trustme.LeafCert) -> None:
        path = tmp / f"{name}.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(path))
        files[name] = path

    server.cert_chain_pems[0].write_to_path(str(tmp / "server-chain.pem"))
    for extra in server.cert_chain_pems[1:]:
        extra.write_to_path(str(tmp / "server-chain.pem"), append=True)
    server.private_key_pem.write_to_path(str(tmp / "server-key.pem"))
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    ca.cert_pem.write_to_path(str(tmp / "client-ca.pem"))
    now = dt.datetime.now(dt.UTC)
    write("acme", ca.issue_cert("acme.example", common_name="acme.example", organization_name="Acme"))
    write("globex", ca.issue_cert("globex.example", common_name="globex.example", organization_name="Globex"))
    write("initech", ca.issue_cert("initech.example", common_name="initech.example", organization_name="Initech"))
    write("umbrella", ca.issue_cert("umbrella.example", common_name="umbrella.example", organization_name="Umbrella"))
    write("stranger", ca.issue_cert("stranger.example", common_name="stranger.example", organization_name="Nobody"))
    write(
        "expired",
        ca.issue_cert(
            "initech.example",
            common_name="initech.example",
            organization_name="Initech",
            not_before=now - dt.timedelta(days=30),
            not_after=now - dt.timedelta(days=1),
        ),
    )
    write("foreign", other.issue_cert("initech.example", common_name="initech.example", organization_name="Initech"))
    return Pki(tmp, ca, other, server, files)


def fingerprint(pem_file: Path) -> str:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    cert = x509.load_pem_x509_certificate(pem_file.read_bytes())
    return cert.fingerprint(hashes.SHA256()).hex()


def subject_of(pem_file: Path) -> tuple[str, str]:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem_file.read_bytes())
    return cert.subject.rfc4514_string(), cert.issuer.rfc4514_string()


@dataclass
class Keys:
    """API keys of the partners the trust tests add (the sample partners keep their demo keys)."""

    initech: str
    umbrella: str
    expired: str
    future: str
    current: str


def trust_config(tmp: Path, pki: Pki, *, server: dict[str, Any] | None = None) -> tuple[Path, Keys]:
    """A configuration file serving HTTPS with *pki*, its partners pinning the test certificates."""
    keys = Keys(
        generate_key("initech-1"),
        generate_key("umbrella-1"),
        generate_key("acme-old"),
        generate_key("acme-next"),
        generate_key("acme-now"),
    )
    data = plain(sample_data(tmp))
    now = dt.datetime.now(dt.UTC)
    partners = data["partners"]
    partners["acme"]["certificates"] = [{"sha256": fingerprint(pki.client("acme")), "label": "acme client"}]
    partners["acme"]["keys"] += [
        {"id": "acme-old", "hash": hash_key(keys.expired), "label": "2025", "not_after": now - dt.timedelta(days=1)},
        {"id": "acme-next", "hash": hash_key(keys.future), "label": "next", "not_before": now + dt.timedelta(days=1)},
        {
            "id": "acme-now",
            "hash": hash_key(keys.current),
            "label": "now",
            "not_before": (now - dt.timedelta(days=1)).isoformat(),
            "not_after": (now + dt.timedelta(days=90)).isoformat(),
        },
    ]
    partners["globex"]["certificates"] = [{"sha256": fingerprint(pki.client("globex"))}]
    subject, issuer = subject_of(pki.client("initech"))
    partners["initech"] = {
        "name": "Initech",
        "auth": "certificate",
        "keys": [{"id": "initech-1", "hash": hash_key(keys.initech)}],
        "certificates": [{"subject": subject, "issuer": issuer, "label": "initech client"}],
    }
    partners["umbrella"] = {
        "name": "Umbrella",
        "auth": "both",
        "keys": [{"id": "umbrella-1", "hash": hash_key(keys.umbrella)}],
        "certificates": [{"sha256": fingerprint(pki.client("umbrella"))}],
    }
    for route in data["routes"]:
        if route.get("partners"):
            route["partners"] = sorted(set(route["partners"]) | {"initech", "umbrella"})
    data["server"] = {
        **data.get("server", {}),
        **(
            server
            if server is not None
            else {
                "tls": {
                    "certificate": str(pki.dir / "server-chain.pem"),
                    "key": str(pki.dir / "server-key.pem"),
                    "client_ca": str(pki.dir / "client-ca.pem"),
                    "reload_interval": "200ms",
                }
            }
        ),
    }
    path = tmp / "b2bgw.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, keys


class Served:
    """``b2bgw serve`` in a subprocess on a free port."""

    def __init__(
        self,
        tmp: Path,
        config: Path,
        *extra: str,
        scheme: str = "https",
        ca: Path | None = None,
        store_url: str | None = None,
    ) -> None:
        self.port = free_port()
        self.base = f"{scheme}://127.0.0.1:{self.port}"
        self.ca = ca
        self.log = tmp / f"serve-{self.port}.log"
        env = {**os.environ, "B2BGW_STORE_URL": store_url or f"sqlite:///{tmp / 'gw.db'}", "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.cli.main",
                "--log-level",
                "INFO",
                "serve",
                "--config",
                str(config),
                "--port",
                str(self.port),
                "--no-etl",
                "--no-stomp",
                *extra,
            ],
            cwd=str(tmp),
            env=env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    def client(self, cert: Path | None = None, **kw: Any) -> httpx.Client:
        import ssl

        ctx = ssl.create_default_context(cafile=str(self.ca)) if self.ca else None
        if ctx is not None and cert is not None:
            ctx.load_cert_chain(str(cert))
        return httpx.Client(base_url=self.base, verify=ctx if ctx is not None else True, timeout=30, **kw)

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with self.client() as c:
                    if c.get("/readyz", timeout=2).status_code == 200:
                        return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"the server did not become ready:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


__all__ = [
    "ACME_KEY",
    "GLOBEX_KEY",
    "Keys",
    "Pki",
    "Served",
    "fingerprint",
    "free_port",
    "make_pki",
    "plain",
    "subject_of",
    "trust_config",
]
