"""AS2 benchmark: inbound AS2 against the plain HTTP intake of the same document on the same server, and
outbound AS2 to a local libas2 receiver.

Prints, in one run:
  1. inbound: messages/s and the server's CPU time per message (its processes' user + system time, from
     /proc) for the 14 KB UBL Order sent (a) signed + encrypted (openssl cms, AES-256-CBC, SHA-256) over AS2
     asking for a signed synchronous MDN, and (b) posted plainly to /v1/documents; and their ratio (the goal
     is AS2 at least half the plain rate);
  2. outbound: AS2 messages/s sent (signed + encrypted, signed MDN verified) to libas2's receiver (Node, from
     tests/gateway/as2/interop; skipped when absent).

Each message has its own document id (and Message-ID): every one is a new document, none a replay.

Usage: python bench/as2_bench.py [--messages N] [--concurrency N]
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests" / "gateway"
sys.path[:0] = [str(TESTS), str(TESTS / "as2")]

from as2kit import OUR_ID, as2_headers, cms_encrypt, cms_sign, entity, make_pki, to_http  # noqa: E402
from gwtest import ACME, ORDER, SAMPLE_CONFIG, with_id  # noqa: E402


def _config(folder: Path, ours, acme) -> Path:
    partners = folder / "partners.yaml"
    text = (
        (REPO / "config" / "partners.yaml")
        .read_text()
        .replace(
            "  acme:\n    name: ACME Corporation (buyer)\n",
            f"  acme:\n    name: ACME Corporation (buyer)\n    as2:\n      id: ACME-AS2\n      certificate: {acme.cert}\n",
            1,
        )
    )
    partners.write_text(text)
    config = folder / "b2bgw.yaml"
    config.write_text(
        SAMPLE_CONFIG.read_text()
        .replace("partners: partners.yaml", f"partners: {partners}")
        .replace("routes: ../routes/ubl-2.1.yaml", f"routes: {REPO}/routes/ubl-2.1.yaml")
        .replace("file: ../rules/", f"file: {REPO}/rules/")
        + f"\nas2:\n  id: {OUR_ID}\n  key: {ours.key}\n  certificate: {ours.cert}\n"
    )
    return config


def _cpu(pid: int) -> float:
    """User + system seconds of *pid* and its live children."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def _run(base: str, requests: list[tuple[str, dict, bytes]], concurrency: int, pid: int) -> tuple[float, float]:
    queue = list(reversed(requests))
    statuses: dict[int, int] = {}

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            path, headers, body = queue.pop()
            response = await client.post(base + path, content=body, headers=headers)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if path == "/as2":
                assert b"processed/error" not in response.content and b"; processed" in response.content, (
                    response.content[-400:]
                )

    async with httpx.AsyncClient(timeout=60) as client:
        cpu, started = _cpu(pid), time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed, used = time.perf_counter() - started, _cpu(pid) - cpu
    assert set(statuses) <= {200, 202}, statuses
    return len(requests) / elapsed, used / len(requests)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="as2-bench-"))
    ours, acme = make_pki(folder, "ours"), make_pki(folder, "acme")
    config = _config(folder, ours, acme)
    print(f"preparing {args.messages} AS2 messages (openssl cms sign + encrypt) of the {len(ORDER)}-byte Order ...")
    as2, plain = [], []
    for i in range(args.messages):
        doc = with_id(ORDER, f"AS2-{i}")
        headers, body = to_http(cms_encrypt(cms_sign(entity(doc), acme), ours))
        as2.append(("/as2", {**as2_headers("ACME-AS2"), **headers}, body))
        plain.append(("/v1/documents", ACME, with_id(ORDER, f"PLAIN-{i}")))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "B2BGW_STORE_URL": f"sqlite:///{folder / 'gw.db'}", "PYTHONPATH": str(REPO)}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli.main",
            "serve",
            "--config",
            str(config),
            "--port",
            str(port),
            "--no-etl",
            "--no-stomp",
            "--no-access-log",
        ],
        cwd=str(folder),
        env=env,
        stdout=(folder / "serve.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        warm = 10
        asyncio.run(_run(base, plain[:warm], args.concurrency, server.pid))
        asyncio.run(_run(base, as2[:warm], args.concurrency, server.pid))
        plain_rate, plain_cpu = asyncio.run(_run(base, plain[warm:], args.concurrency, server.pid))
        time.sleep(1)
        as2_rate, as2_cpu = asyncio.run(_run(base, as2[warm:], args.concurrency, server.pid))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    n = args.messages - warm
    print(f"inbound, {n} messages each, concurrency {args.concurrency}, one serving process:")
    print(f"  plain HTTP /v1/documents : {plain_rate:7.1f} msg/s   server CPU {plain_cpu * 1000:6.2f} ms/msg")
    print(f"  AS2 signed+encrypted+MDN : {as2_rate:7.1f} msg/s   server CPU {as2_cpu * 1000:6.2f} ms/msg")
    print(f"  AS2 / plain rate         : {as2_rate / plain_rate:7.0%}   (goal: at least 50%)")
    _outbound(folder, ours, acme, min(100, args.messages))
    shutil.rmtree(folder, ignore_errors=True)
    return 0


def _outbound(folder: Path, ours, partner, count: int) -> None:
    node, interop = shutil.which("node"), TESTS / "as2" / "interop"
    if node is None or not (interop / "node_modules" / "libas2").is_dir():
        print("outbound: skipped (needs Node and `npm ci` in tests/gateway/as2/interop)")
        return
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from gateway.as2.cms import Identity
    from gateway.as2.config import As2Settings
    from gateway.as2.outbound import As2Endpoint, OutboundRequest, send_message
    from gateway.delivery.addresses import AddressPolicy

    options = folder / "receiver.json"
    options.write_text(
        json.dumps(
            {
                "hostId": "ACME-AS2",
                "hostCert": partner.cert.read_text(),
                "hostKey": partner.key.read_text(),
                "partnerId": OUR_ID,
                "partnerCert": ours.cert.read_text(),
            }
        )
    )
    # --security-revert=CVE-2023-46809: Node 20 refuses RSA PKCS #1 v1.5 decryption without it
    process = subprocess.Popen(
        [node, "--security-revert=CVE-2023-46809", str(interop / "as2node.js"), "serve", str(options)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        port = next(json.loads(line) for line in process.stdout if line.startswith(b"{"))["port"]
        cert = x509.load_pem_x509_certificate(partner.cert.read_bytes())
        loopback = AddressPolicy(allow=(ipaddress.ip_network("127.0.0.0/8"),))  # the receiver runs on this machine
        endpoint = As2Endpoint(f"http://127.0.0.1:{port}/as2", "ACME-AS2", (cert,), cert, addresses=loopback)
        key = serialization.load_pem_private_key(ours.key.read_bytes(), None)
        settings = As2Settings(OUR_ID, Identity(key, x509.load_pem_x509_certificate(ours.cert.read_bytes())))

        async def send_all() -> float:
            async with httpx.AsyncClient(follow_redirects=False) as client:
                started = time.perf_counter()
                for i in range(count):
                    result = await send_message(
                        endpoint,
                        settings,
                        OutboundRequest(
                            f"bench-{i}", "acme", "as2", with_id(ORDER, f"OUT-{i}"), "application/xml", 1, 30.0
                        ),
                        client=client,
                    )
                    assert result.outcome == "delivered", result.detail
                return count / (time.perf_counter() - started)

        rate = asyncio.run(send_all())
        print(f"outbound AS2 to libas2 (one at a time, signed MDN verified, MIC compared): {rate:6.1f} msg/s")
    finally:
        process.terminate()
        process.wait(10)


if __name__ == "__main__":
    sys.exit(main())
