"""broker_core.collector: a long-running process's collector after start-up (run in a child process: the
collector's settings are the whole interpreter's)."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import gc
from broker_core.collector import STOMP_YOUNG, settle_collector
kept = [[n] for n in range(50_000)]  # long-lived, built at start-up
settle_collector(STOMP_YOUNG)
print(gc.get_threshold(), gc.get_freeze_count() >= 50_000)
cycle = []
cycle.append(cycle)  # unreachable garbage made after start-up is still collected
del cycle
print(gc.collect() >= 1)
"""


def test_start_up_objects_are_frozen_and_a_listener_collects_its_young_generation_less_often():
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "(20000, 20, 20) True"
    assert out[1] == "True"


def test_a_gateway_freezes_its_start_up_and_keeps_the_default_threshold():
    program = (
        "import gc\nfrom broker_core.collector import settle_collector\n"
        "before = gc.get_threshold()\nsettle_collector()\nprint(gc.get_threshold() == before, gc.get_freeze_count() > 0)"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True True"
