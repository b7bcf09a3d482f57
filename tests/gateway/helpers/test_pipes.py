"""The budget of a helper process's job (gateway.helpers.pipes.Budget): processor time, waited for at most the
longest wait on the clock; on a real child process, busy or stopped."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gateway.helpers.pipes import Budget, OverloadedError, cpu_clock, wait_readable

BUSY = "while True: pass"
IDLE = "import time; time.sleep(60)"


@pytest.fixture
def child(request):
    started: list[subprocess.Popen] = []

    def start(code: str) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", code])
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


@pytest.fixture
def silent_pipe():
    """A pipe nobody writes to: what a helper that is still working looks like."""
    read, write = os.pipe()
    yield read
    os.close(read)
    os.close(write)


def _waited(fd: int, budget: Budget) -> tuple[type[BaseException] | None, float]:
    started = time.monotonic()
    try:
        wait_readable(fd, budget)
    except (TimeoutError, OverloadedError) as exc:
        return type(exc), time.monotonic() - started
    return None, time.monotonic() - started


def test_a_process_that_works_spends_its_budget_in_about_that_much_processor_time(child, silent_pipe):
    process = child(BUSY)
    clock = cpu_clock(process.pid)
    assert clock is not None, "this system has no process CPU clock"
    budget = Budget(clock, 0.3, 30.0, time.monotonic())
    raised, took = _waited(silent_pipe, budget)
    assert raised is TimeoutError
    assert 0.3 <= took < 3.0  # the child had most of a processor: its budget, not the longest wait
    assert time.clock_gettime(clock) - budget.cpu_started >= 0.3


def test_a_process_that_gets_no_processor_time_is_given_the_longest_wait_then_overloaded(child, silent_pipe):
    process = child(IDLE)  # asleep: like a process the machine gives no processor time
    budget = Budget(cpu_clock(process.pid), 0.2, 1.0, time.monotonic())
    started = time.monotonic()
    with pytest.raises(OverloadedError) as raised:
        wait_readable(silent_pipe, budget)
    assert 1.0 <= time.monotonic() - started < 2.0
    assert raised.value.used < 0.2 and raised.value.elapsed >= 1.0
    assert budget.extended  # it was given more time than its budget on the clock


def test_the_longest_wait_is_never_shorter_than_the_budget(child, silent_pipe):
    process = child(IDLE)
    budget = Budget(cpu_clock(process.pid), 0.5, 0.1, time.monotonic())
    raised, took = _waited(silent_pipe, budget)
    assert raised is OverloadedError and took >= 0.5


def test_without_a_clock_the_budget_is_time_on_the_clock(silent_pipe):
    budget = Budget(None, 0.2, 30.0, time.monotonic())
    raised, took = _waited(silent_pipe, budget)
    assert raised is TimeoutError and 0.2 <= took < 1.0 and not budget.extended


def test_an_answer_within_the_budget_ends_the_wait_at_once(child):
    process = child(IDLE)
    read, write = os.pipe()
    try:
        os.write(write, b"x")
        raised, took = _waited(read, Budget(cpu_clock(process.pid), 5.0, 30.0, time.monotonic()))
        assert raised is None and took < 0.5
    finally:
        os.close(read)
        os.close(write)


def test_a_process_that_has_gone_has_no_clock():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert cpu_clock(process.pid) is None
