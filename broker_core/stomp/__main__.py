"""``python -m broker_core.stomp --url sqlite:///var/b2bgw.db --port 61613 --user LOGIN:HASH``.

Each ``--user`` may consume, browse and send everywhere (a trusted back end);
at least one is required. ``--hash-passcode`` prints the hash of a passcode
read on standard input."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from .. import Broker
from ..collector import STOMP_YOUNG, settle_collector
from ._passcodes import hash_passcode, is_passcode_hash
from ._server import DEFAULT_PORT, StompServer
from ._users import StompUser


def _users(values: Sequence[str]) -> list[StompUser]:
    if not values:
        raise SystemExit(
            "give at least one --user LOGIN:HASH (the hash from --hash-passcode): a listener without "
            "users would accept any login"
        )
    users = []
    for value in values:
        login, sep, encoded = value.partition(":")
        if not sep or not login or not is_passcode_hash(encoded):
            raise SystemExit(f"--user expects LOGIN:HASH, the hash as --hash-passcode prints it; got {value[:60]!r}")
        users.append(StompUser.with_all_rights(login, encoded))
    return users


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker_core.stomp", description="Run the STOMP listener alone.")
    parser.add_argument("--url", default="memory://", help="broker store URL (memory://, sqlite:///path, ...)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any)")
    parser.add_argument(
        "--user",
        action="append",
        default=[],
        metavar="LOGIN:HASH",
        help="a login and its passcode's hash, with every right (repeatable; at least one)",
    )
    parser.add_argument(
        "--hash-passcode", action="store_true", help="print the hash of the passcode read on standard input, and exit"
    )
    parser.add_argument(
        "--heartbeat",
        default="10000,10000",
        metavar="SEND,RECV",
        help="heart-beat milliseconds offered (default 10000,10000)",
    )
    parser.add_argument("--prefetch", type=int, default=1000, help="default per-subscription prefetch")
    parser.add_argument("--max-frame-size", type=int, default=10 * 1024 * 1024, help="largest body accepted (bytes)")
    parser.add_argument(
        "--selector-string-numbers",
        choices=("convert", "strict"),
        default="convert",
        help="selectors read the string headers of messages sent here as numbers where they want "
        "one (convert, as ActiveMQ; the default) or keep the JMS rule (strict)",
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if args.hash_passcode:
        passcode = sys.stdin.readline().rstrip("\r\n")
        if not passcode:
            raise SystemExit("no passcode on standard input")
        print(hash_passcode(passcode))
        return 0
    users = _users(args.user)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        sx, sy = (int(p) for p in args.heartbeat.split(","))
    except ValueError:
        parser.error("--heartbeat expects SEND,RECV milliseconds")
    broker = Broker.open(args.url)

    async def run() -> None:
        server = StompServer(
            broker,
            host=args.host,
            port=args.port,
            users=users,
            heartbeat=(sx, sy),
            max_frame_size=args.max_frame_size,
            prefetch=args.prefetch,
            selector_string_numbers=args.selector_string_numbers,
        )
        await server.start()
        settle_collector(STOMP_YOUNG)  # see broker_core.collector
        print(f"STOMP listening on {server.host}:{server.port} ({args.url})", flush=True)
        await server.serve_forever()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    finally:
        broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
