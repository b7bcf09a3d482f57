"""broker_core.collector: a long-running process's collector after start-up (run in a child process: the
collector's settings are the whole interpreter's)."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import gc
from broker_core.collector import GATEWAY_YOUNG, settle_collector
kept = [[n] for n in range(50_000)]  # long-lived, built at start-up
settle_collector(GATEWAY_YOUNG)
print(gc.get_threshold(), gc.get_freeze_count() >= 50_000)
cycle = []
cycle.append(cycle)  # unreachable garbage made after start-up is still collected
del cycle
print(gc.collect() >= 1)
"""


def test_start_up_objects_are_frozen_and_young_collections_are_rarer():
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "(5000, 20, 20) True"
    assert out[1] == "True"
