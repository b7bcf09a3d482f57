"""On PostgreSQL, processes serving from one database agree on the server secret, the migrated key digests
and the operators' lockout (each made in one process, read in another)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from gwtest import REPO

from gateway.cli import main as cli
from gateway.config.loader import load_yaml, settings_from_mapping
from gateway.routing.partners import PartnerRegistry, generate_key, hash_key
from gateway.runtime.serving import open_broker
from gateway.security.keys import KeyDigests, hmac_hash
from gateway.security.lockout import Lockout

pytestmark = pytest.mark.postgres

OTHER_PROCESS = """
import json, sys
from gateway.config.loader import load_yaml, settings_from_mapping
from gateway.routing.partners import PartnerRegistry
from gateway.runtime.serving import open_broker
from gateway.security.keys import KeyDigests
from gateway.security.lockout import Lockout

url, key, encoded = sys.argv[1:4]
broker = open_broker(settings_from_mapping({"store": {"url": url, "options": {"sweep_interval": 0}}}))
digests = KeyDigests.for_broker(broker)
registry = PartnerRegistry.from_mapping(load_yaml(text=f"p1:\\n  keys:\\n    - id: pg-old\\n      hash: \\"{encoded}\\"\\n"))
registry.attach(digests)
partner = registry.authenticate(f"Bearer {key}").id  # migrates the scrypt key
lockout = Lockout(broker.engine, broker.write, attempts=2, window=60)
locks = [lockout.fail("alice", "198.51.100.7") for _ in range(2)]
print(json.dumps({"secret": digests.secret.hex(), "partner": partner, "scrypt": registry.verifications,
                  "locks": locks}))
broker.close()
"""


def test_processes_on_one_database_share_the_secret_the_digests_and_the_lockout(postgres_schema):
    assert cli.main(["db", "upgrade", "--url", postgres_schema]) == 0
    key = generate_key("pg-old")
    encoded = hash_key(key, ln=10)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-c", OTHER_PROCESS, postgres_schema, key, encoded],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    other = json.loads(done.stdout.strip().splitlines()[-1])
    assert other["partner"] == "p1" and other["scrypt"] == 1 and other["locks"][-1] > 0

    broker = open_broker(settings_from_mapping({"store": {"url": postgres_schema, "options": {"sweep_interval": 0}}}))
    try:
        digests = KeyDigests.for_broker(broker)
        assert digests.secret.hex() == other["secret"]  # one secret for every process
        registry = PartnerRegistry.from_mapping(
            load_yaml(text=f'p1:\n  keys:\n    - id: pg-old\n      hash: "{encoded}"\n')
        )
        registry.attach(digests)
        assert registry.authenticate(f"Bearer {key}").id == "p1"
        assert registry.verifications == 0  # migrated by the other process: no scrypt here
        fresh = generate_key("pg-new")  # a key made for this store verifies in any of its processes
        registry = PartnerRegistry.from_mapping(
            load_yaml(
                text=f'p2:\n  keys:\n    - id: pg-new\n      hash: "{hmac_hash(bytes.fromhex(other["secret"]), fresh)}"\n'
            )
        )
        registry.attach(digests)
        assert registry.authenticate(f"Bearer {fresh}").id == "p2"
        lockout = Lockout(broker.engine, broker.write, attempts=2, window=60)
        assert lockout.retry_after("alice", "198.51.100.7") > 0  # locked by the other process
        assert lockout.retry_after("alice", "198.51.100.8") == 0
    finally:
        broker.close()
