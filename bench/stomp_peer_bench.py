"""b2bgw's STOMP listener and another STOMP broker, side by side, same client.

    python bench/stomp_peer_bench.py --peer 127.0.0.1:61623 [--peer-login admin --peer-passcode admin]
        [--runs 3] [--messages 20000] [--size 2048] [--rounds 2000] [--selective-wait 60]
        [--cases np,p,pr,rr,sel] [--peer-pid PID] [--split-client]

Runs stomp_bench's workloads (non-persistent and persistent end-to-end
throughput, request-reply through a temporary queue, a selective subscriber
on a deep queue), and persistent throughput with a RECEIPT asked for on
every 100th SEND (``pr``: ActiveMQ syncs its journal for a persistent SEND
only when a receipt is asked for; b2bgw commits every persistent SEND
durably), against a ``python -m broker_core.stomp`` started here on a fresh
SQLite store (``synchronous=FULL``, the default) and against a broker
already listening at ``--peer`` (ActiveMQ; see docs/performance.md for its
set-up). Both stay up for the whole run: a warm-up round first (not
counted), then ``--runs`` measured rounds, the two brokers alternating
(which goes first alternates too). Every round uses new queue names; the
selective case's unmatched messages are drained afterwards, so no round
starts with another's leftovers. Prints each figure per broker (median,
min-max), the median of the per-round ratios, the servers' CPU per message
(b2bgw's, and the peer's with ``--peer-pid``), the clients' (this process,
stomp.py), and the load average before and after. With ``--split-client``
the throughput cases' consumer runs in a process of its own (its CPU counted
with the clients'), so that it does not share the producer's interpreter
lock. Nothing is installed or started for the peer.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

import stomp
from stomp_bench import Target, connect, request_reply, selective, start_server, throughput

CASES = ("np", "p", "pr", "rr", "sel")
LABELS = {
    "np": "non-persistent msg/s",
    "p": "persistent msg/s",
    "pr": "persistent, receipt every 100, msg/s",
    "rr50": "request-reply p50 ms",
    "rr99": "request-reply p99 ms",
    "sel": "selective matches/s",
}
HIGHER_IS_BETTER = {"np": True, "p": True, "pr": True, "rr50": False, "rr99": False, "sel": True}

PEER_HELP = """\
No STOMP broker answers at {peer} ({error}).
This benchmark does not install or start one. For ActiveMQ 5.17 (Debian):
  apt-get install activemq
  add <transportConnector name="stomp" uri="stomp://127.0.0.1:61623"/> to the <transportConnectors> of
      /etc/activemq/instances-available/main/activemq.xml
  ln -s /etc/activemq/instances-available/main /etc/activemq/instances-enabled/main
  /etc/init.d/activemq start
then run again with --peer 127.0.0.1:61623 (see docs/performance.md)."""


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def check_peer(target: Target) -> str | None:
    """None if a STOMP broker accepts the login at ``target``, else why not."""
    try:
        socket.create_connection((target.host, target.port), timeout=5).close()
    except OSError as error:
        return str(error)
    try:
        conn = connect(target)
    except Exception as error:  # stomp.py raises several kinds
        return f"the port answers but a STOMP CONNECT failed: {type(error).__name__}: {error}"
    conn.disconnect()
    return None


def drain(target: Target, queue: str, quiet: float = 1.0) -> int:
    """Consume whatever is left on ``queue`` (auto ack) until nothing comes for ``quiet`` seconds."""
    got = [0]
    last = [time.monotonic()]

    class Drainer(stomp.ConnectionListener):
        def on_message(self, frame: Any) -> None:
            got[0] += 1
            last[0] = time.monotonic()

    conn = connect(target, Drainer())
    conn.subscribe(f"/queue/{queue}", id="drain", ack="auto")
    while time.monotonic() - last[0] < quiet:
        time.sleep(quiet / 4)
    conn.disconnect()
    return got[0]


class Side:
    """One broker's figures: per case, per measured round."""

    def __init__(self, name: str, target: Target, pid: int | None) -> None:
        self.name = name
        self.target = target
        self.pid = pid
        self.figures: dict[str, list[float]] = {key: [] for key in LABELS}
        self.cpu: dict[str, list[float]] = {key: [] for key in CASES}  # server CPU µs per message
        self.client_cpu: dict[str, list[float]] = {key: [] for key in CASES}  # this process's (the clients')
        self.notes: list[str] = []

    def run(self, case: str, args: argparse.Namespace, tag: str, record: bool) -> None:
        target = self.target
        before = cpu_seconds(self.pid)
        client_before = sum(os.times()[:2])
        count = args.messages
        child: list[float] = []  # the consumer process's CPU seconds (--split-client)
        split = {"split": args.split_client, "child_cpu": child}
        if case == "np":
            figures = {"np": throughput(target, args.messages, args.size, False, f"np-{tag}", **split)}
        elif case == "p":
            figures = {"p": throughput(target, args.messages, args.size, True, f"p-{tag}", **split)}
        elif case == "pr":
            figures = {"pr": throughput(target, args.messages, args.size, True, f"pr-{tag}", 100, **split)}
        elif case == "rr":
            count = 2 * (args.rounds + 100)  # requests and replies, warm-up rounds included
            p50, p99 = request_reply(target, args.rounds, f"rr-{tag}")
            figures = {"rr50": p50, "rr99": p99}
        else:
            count = args.messages + 1 + args.messages // 10  # sent, the marker, the matches delivered
            got, matches, elapsed = selective(target, args.messages, args.size, f"sel-{tag}", args.selective_wait)
            figures = {"sel": got / elapsed}
            self.notes.append(f"selective round {tag}: {got} of {matches} in {elapsed:.2f} s")
        after = cpu_seconds(self.pid)
        client = sum(os.times()[:2]) - client_before + sum(child)
        if case == "sel":
            drain(target, f"sel-{tag}")
        if not record:
            return
        for key, value in figures.items():
            self.figures[key].append(value)
        if before is not None and after is not None:
            self.cpu[case].append((after - before) / count * 1e6)
        self.client_cpu[case].append(client / count * 1e6)


def spread(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def report(ours: Side, peer: Side, cases: list[str]) -> None:
    rows = [("figure", "b2bgw", peer.name, "ratio b2bgw/peer (better)")]
    for key, label in LABELS.items():
        if (key[:2] if key.startswith("rr") else key) not in cases:
            continue
        mine, theirs = ours.figures[key], peer.figures[key]
        fmt = ",.2f" if key.startswith("rr") else ",.0f"
        pairs = list(zip(mine, theirs, strict=False))
        if HIGHER_IS_BETTER[key]:
            ratios = [a / b for a, b in pairs if b > 0]
        else:  # a time: how many times faster
            ratios = [b / a for a, b in pairs if a > 0]
        ratio = f"{spread(ratios, '.2f')}x" if ratios else "-"
        rows.append((label, spread(mine, fmt), spread(theirs, fmt), ratio))
    for case in cases:
        if ours.cpu[case] or peer.cpu[case]:
            rows.append(
                (f"server CPU µs/msg, {case}", spread(ours.cpu[case], ".1f"), spread(peer.cpu[case], ".1f"), "")
            )
    for case in cases:
        mine, theirs = ours.client_cpu[case], peer.client_cpu[case]
        rows.append((f"client CPU µs/msg, {case}", spread(mine, ".1f"), spread(theirs, ".1f"), ""))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    for side in (ours, peer):
        for note in side.notes:
            print(f"{side.name}: {note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", default="127.0.0.1:61623", help="host:port of the other broker's STOMP listener")
    parser.add_argument("--peer-login", default="admin")
    parser.add_argument("--peer-passcode", default="admin")
    parser.add_argument("--peer-name", default="ActiveMQ")
    parser.add_argument("--peer-pid", type=int, help="the peer's process id, for its CPU per message")
    parser.add_argument("--runs", type=int, default=3, help="measured rounds after the warm-up round")
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=2000, help="request-reply rounds")
    parser.add_argument("--selective-wait", type=float, default=60, help="seconds the selective subscriber waits")
    parser.add_argument("--cases", default=",".join(CASES), help="some of " + ",".join(CASES))
    parser.add_argument(
        "--split-client",
        action="store_true",
        help="throughput cases (np, p, pr): the consumer in a process of its own, the producer in this one",
    )
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; choose from {','.join(CASES)}")
    host, _, port = args.peer.rpartition(":")
    peer_target = Target(host or "127.0.0.1", int(port), args.peer_login, args.peer_passcode)
    problem = check_peer(peer_target)
    if problem is not None:
        print(PEER_HELP.format(peer=args.peer, error=problem), file=sys.stderr)
        return 2
    workdir = tempfile.mkdtemp(prefix="stomp-peer-", dir="/tmp/stomp" if os.path.isdir("/tmp/stomp") else None)
    url = f"sqlite:///{workdir}/bench.db"
    proc, our_port = start_server(url)
    ours = Side("b2bgw", Target("127.0.0.1", our_port), proc.pid)
    peer = Side(args.peer_name, peer_target, args.peer_pid)
    run_id = uuid.uuid4().hex[:8]
    try:
        print(
            f"b2bgw: pid {proc.pid} on 127.0.0.1:{our_port}, store {url}; {args.peer_name}: {args.peer}"
            f"{f' pid {args.peer_pid}' if args.peer_pid else ''}; client stomp.py {stomp.__version__}; "
            f"{args.messages} x {args.size} B, {args.rounds} request-reply rounds; cases {','.join(cases)}"
            f"{'; consumer and producer in two processes' if args.split_client else ''}"
        )
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for number in range(args.runs + 1):
            record = number > 0
            for case in cases:
                order = (ours, peer) if number % 2 == 0 else (peer, ours)
                for side in order:
                    tag = f"{run_id}-{number}"
                    started = time.perf_counter()
                    side.run(case, args, tag, record)
                    print(
                        f"  {'round ' + str(number) if record else 'warm-up'} {case:>3} {side.name}: "
                        f"{time.perf_counter() - started:.1f} s",
                        flush=True,
                    )
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        report(ours, peer, cases)
        return 0
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:
            proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
