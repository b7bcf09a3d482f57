"""``b2bgw serve --listen-fd`` (the socket a supervisor, systemd or anything else bound) runs the demo-key
check on the address that socket really listens on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from gwtest import REPO, SAMPLE_CONFIG


def test_an_inherited_socket_on_every_address_is_refused_with_the_demo_keys(tmp_path):
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen()
    env = {
        **os.environ,
        "B2BGW_STORE_URL": f"sqlite:///{tmp_path / 'fd.db'}",
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "gateway.cli.main",
                "serve",
                "-c",
                str(SAMPLE_CONFIG),
                "--listen-fd",
                str(sock.fileno()),
                "--no-stomp",
                "--no-etl",
                "--no-workers",
            ],
            pass_fds=[sock.fileno()],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        sock.close()
    assert proc.returncode != 0
    assert "refusing to listen on 0.0.0.0" in proc.stderr and "acme-demo" in proc.stderr, proc.stderr[-2000:]
