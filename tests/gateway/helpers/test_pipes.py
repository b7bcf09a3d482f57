"""The budget of a helper process's job (gateway.helpers.budget.Budget): processor time, waited for at most the
longest wait on the clock; on a real child process, busy or stopped. And the messages on a helper's pipes
(gateway.helpers.framing): read whole, within their caps and deadlines."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gateway.helpers.budget import Budget, OverloadedError, cpu_clock, wait_readable
from gateway.helpers.framing import (
    FRAME,
    pack_record,
    read_frame,
    read_record,
    take_frame,
    take_record,
    write_frame,
    write_record,
)
from gateway.helpers.workers import SharedHelpers

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


class FakeCpu:
    """A helper process's processor seconds, moved by the test."""

    def __init__(self) -> None:
        self.used: float | None = 0.0

    def __call__(self) -> float | None:
        return self.used


def test_a_job_ends_when_its_process_has_spent_its_processor_time():
    cpu = FakeCpu()
    budget = Budget(cpu, 0.3, 30.0, now=100.0)
    assert budget.check(100.1) == pytest.approx(0.3)  # nothing spent yet: look again when it could be
    cpu.used = 0.2
    assert budget.check(100.2) == pytest.approx(0.1)
    cpu.used = 0.3
    with pytest.raises(TimeoutError):
        budget.check(100.3)
    assert not budget.extended


def test_a_starved_process_is_given_the_longest_wait_then_the_gateway_is_overloaded():
    """A loaded machine gives the helper no processor: its job is not refused as too costly at once (one
    partner's burst would have another's honest document refused), but the wait on the clock is bounded."""
    cpu = FakeCpu()
    budget = Budget(cpu, 0.2, 1.0, now=0.0)
    cpu.used = 0.05
    assert budget.check(0.5) == pytest.approx(0.15)  # past its budget on the clock, within it on the processor
    assert budget.extended
    with pytest.raises(OverloadedError) as raised:
        budget.check(1.0)
    assert raised.value.used == pytest.approx(0.05) and raised.value.elapsed == pytest.approx(1.0)


def test_the_longest_wait_is_never_shorter_than_the_budget():
    budget = Budget(FakeCpu(), 0.5, 0.1, now=0.0)
    assert budget.longest == 0.5
    assert budget.check(0.3) == pytest.approx(0.2)
    with pytest.raises(OverloadedError):
        budget.check(0.5)


def test_without_a_clock_the_budget_is_time_on_the_clock():
    budget = Budget(None, 0.2, 30.0, now=10.0)
    assert budget.check(10.05) == pytest.approx(0.15)
    with pytest.raises(TimeoutError):
        budget.check(10.25)
    assert not budget.extended


def test_a_process_that_has_gone_leaves_time_on_the_clock():
    cpu = FakeCpu()
    budget = Budget(cpu, 0.2, 30.0, now=0.0)
    cpu.used = None  # its clock can no longer be read
    with pytest.raises(TimeoutError):
        budget.check(0.2)


def test_on_a_real_busy_child_the_wait_ends_in_a_timeout(child, silent_pipe):
    """The processor clock of a real process (cpu_clock) drives the budget: a child that keeps a processor
    busy spends its budget and the wait ends with TimeoutError, never OverloadedError."""
    process = child(BUSY)
    clock = cpu_clock(process.pid)
    assert clock is not None, "this system has no process CPU clock"
    budget = Budget(clock, 0.3, 60.0, time.monotonic())
    with pytest.raises(TimeoutError):
        wait_readable(silent_pipe, budget)
    assert time.clock_gettime(clock) - budget.cpu_started >= 0.3


def test_on_a_real_idle_child_the_wait_ends_overloaded(child, silent_pipe):
    process = child(IDLE)  # asleep: like a process the machine gives no processor time
    budget = Budget(cpu_clock(process.pid), 0.2, 0.5, time.monotonic())
    with pytest.raises(OverloadedError) as raised:
        wait_readable(silent_pipe, budget)
    assert raised.value.used < 0.2 and budget.extended


def test_an_answer_ends_the_wait_at_once(child):
    process = child(IDLE)
    read, write = os.pipe()
    try:
        os.write(write, b"x")
        assert _waited(read, Budget(cpu_clock(process.pid), 60.0, 600.0, time.monotonic()))[0] is None
    finally:
        os.close(read)
        os.close(write)


def test_a_process_that_has_gone_has_no_clock():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert cpu_clock(process.pid) is None


# --------------------------------------------------------------------------- messages on the pipes


@pytest.fixture
def pipe():
    read, write = os.pipe()
    yield read, write
    for fd in (read, write):
        try:
            os.close(fd)
        except OSError:
            pass


def test_a_frame_and_a_record_come_back_as_they_were_sent(pipe):
    read, write = pipe
    write_frame(write, {"id": 7, "stage": "final"}, b"body")
    write_record(write, b"R\0out")
    assert read_frame(read, time.monotonic() + 5, max_head=1024, max_payload=1024) == (
        {"id": 7, "stage": "final"},
        b"body",
    )
    assert read_record(read, time.monotonic() + 5) == b"R\0out"


def test_a_frame_over_its_caps_is_refused(pipe):
    read, write = pipe
    write_frame(write, {"x": "y" * 100}, b"z" * 100)
    with pytest.raises(ValueError):
        read_frame(read, max_head=1024, max_payload=10)


def test_a_message_that_does_not_come_whole_in_time_or_at_all(pipe):
    read, write = pipe
    os.write(write, FRAME.pack(10, 0) + b"{")
    with pytest.raises(TimeoutError):
        read_frame(read, time.monotonic() + 0.2, max_head=1024, max_payload=None)
    os.close(write)
    with pytest.raises(EOFError):
        read_record(read)


def test_messages_are_taken_from_a_buffer_only_whole_and_within_their_caps():
    frames = bytearray()
    whole = FRAME.pack(2, 0) + b"{}"
    frames += whole + whole[:5]
    assert take_frame(frames, max_head=1024, max_payload=0) == (b"{}", b"")
    assert take_frame(frames, max_head=1024, max_payload=0) is None and len(frames) == 5  # incomplete: kept
    with_payload = bytearray(FRAME.pack(2, 1) + b"{}x")
    assert take_frame(with_payload, max_head=1024, max_payload=0) is None and len(with_payload) == 11
    record = pack_record(b"answer")
    assert take_record(record[:-1]) is None and take_record(record + b"more") == b"answer"


def test_a_shared_helper_is_stopped_by_its_last_user():
    class Owner:
        stopped = False

        def stop(self):
            self.stopped = True

    shared: SharedHelpers[Owner] = SharedHelpers()
    first = shared.acquire("k", Owner)
    assert shared.acquire("k", Owner) is first
    shared.release("k", first)
    assert not first.stopped
    shared.release("k", first)
    assert first.stopped and shared.acquire("k", Owner) is not first
    shared.stop_all()
