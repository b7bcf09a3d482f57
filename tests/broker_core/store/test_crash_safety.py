"""Crash safety with real processes killed by SIGKILL.

Two producers send 10,000 persistent messages in all while two consumers
receive them in CLIENT mode; twenty times a random producer or consumer is
killed with SIGKILL and restarted. At the end: every message whose send
returned was delivered (lost = 0), no message was delivered again after its
acknowledgement (duplicated = 0), and every message delivered again after a
delivery that was not acknowledged carried ``jms_redelivered``.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HAVE_SQL_STORE = importlib.util.find_spec("broker_core._sql") is not None

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_SQL_STORE, reason="the SQL store is not installed")]

WORKER = Path(__file__).with_name("crash_worker.py")
TOTAL = 10_000
KILLS = 20


def _spawn(role: str, url: str, log: Path, incarnation: int, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    return subprocess.Popen([sys.executable, str(WORKER), role, url, str(log), str(incarnation), *extra], env=env)


def _read(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [line.split() for line in log.read_text().splitlines() if line.strip()]


def _resume_point(log: Path, first: int) -> int:
    sent = [int(parts[1].split(".")[0]) for parts in _read(log) if parts[0] == "S"]
    return max(sent) + 1 if sent else first


def run_crash_scenario(url: str, tmp_path: Path) -> tuple[int, int, int]:
    rng = random.Random(20261122)
    done_flag = tmp_path / "producers-done"
    half = TOTAL // 2
    ranges = {"p0": (0, half), "p1": (half, TOTAL)}
    logs = {name: tmp_path / f"{name}.log" for name in ("p0", "p1", "c0", "c1")}
    incarnations = collections.Counter()

    def start(name: str) -> subprocess.Popen:
        incarnations[name] += 1
        if name.startswith("p"):
            first, last = ranges[name]
            resume = _resume_point(logs[name], first)
            return _spawn("producer", url, logs[name], incarnations[name] * 10 + int(name[1]), str(resume), str(last))
        return _spawn("consumer", url, logs[name], incarnations[name], str(done_flag))

    procs = {name: start(name) for name in logs}
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.3, 1.2))
            alive = [n for n, p in procs.items() if p.poll() is None]
            if not alive:
                break
            victim = rng.choice(alive)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            procs[victim] = start(victim)
        # let the producers finish (restarting any that died for another reason)
        deadline = time.monotonic() + 300
        for name in ("p0", "p1"):
            while procs[name].wait(timeout=max(1, deadline - time.monotonic())) != 0:
                assert time.monotonic() < deadline, f"producer {name} keeps failing"
                procs[name] = start(name)
        done_flag.write_text("done")
        for name in ("c0", "c1"):
            assert procs[name].wait(timeout=300) == 0, f"consumer {name} failed"
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    sent = {parts[1] for name in ("p0", "p1") for parts in _read(logs[name]) if parts[0] == "S"}
    events = sorted((parts for name in ("c0", "c1") for parts in _read(logs[name])), key=lambda p: int(p[3]))
    delivered: set[str] = set()
    acked: set[str] = set()
    duplicated = 0
    unflagged = 0
    pending: set[str] = set()  # delivered, not (known to be) acknowledged
    for parts in events:
        kind, key = parts[0], parts[1]
        if kind == "D":
            if key in acked:
                duplicated += 1
            elif key in delivered and parts[2] != "1":
                unflagged += 1
            delivered.add(key)
            pending.add(key)
        elif kind == "A":
            acked.add(key)
            pending.discard(key)
    lost = len(sent - delivered)
    print(
        f"\ncrash test on {url.split('?')[0]}: sent={len(sent)} delivered={len(delivered)} acked={len(acked)} "
        f"kills={KILLS} lost={lost} duplicated={duplicated} redelivered-without-flag={unflagged}"
    )
    assert len(sent) >= TOTAL * 0.99  # what the producers confirmed (a killed send may be unconfirmed)
    return lost, duplicated, unflagged


def test_sigkill_sqlite(tmp_path):
    lost, duplicated, unflagged = run_crash_scenario(f"sqlite:///{tmp_path / 'crash.db'}", tmp_path)
    assert (lost, duplicated, unflagged) == (0, 0, 0)


@pytest.mark.postgres
def test_sigkill_postgres(postgres_schema, tmp_path):
    lost, duplicated, unflagged = run_crash_scenario(postgres_schema, tmp_path)
    assert (lost, duplicated, unflagged) == (0, 0, 0)
