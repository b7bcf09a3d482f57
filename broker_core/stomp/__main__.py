"""``python -m broker_core.stomp --url sqlite:///var/b2bgw.db --port 61613``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Sequence

from .. import Broker
from ._server import DEFAULT_PORT, StompServer


def _users(values: Sequence[str]) -> dict[str, str] | None:
    if not values:
        return None
    users = {}
    for value in values:
        login, sep, passcode = value.partition(":")
        if not sep or not login:
            raise SystemExit(f"--user expects LOGIN:PASSCODE, got {value!r}")
        users[login] = passcode
    return users


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker_core.stomp", description="Run the STOMP listener alone.")
    parser.add_argument("--url", default="memory://", help="broker store URL (memory://, sqlite:///path, ...)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any)")
    parser.add_argument("--user", action="append", default=[], metavar="LOGIN:PASSCODE",
                        help="accepted login (repeatable); without any, every login is accepted")
    parser.add_argument("--heartbeat", default="10000,10000", metavar="SEND,RECV",
                        help="heart-beat milliseconds offered (default 10000,10000)")
    parser.add_argument("--prefetch", type=int, default=1000, help="default per-subscription prefetch")
    parser.add_argument("--max-frame-size", type=int, default=10 * 1024 * 1024, help="largest body accepted (bytes)")
    parser.add_argument("--selector-string-numbers", choices=("convert", "strict"), default="convert",
                        help="selectors read the string headers of messages sent here as numbers where they want "
                             "one (convert, as ActiveMQ; the default) or keep the JMS rule (strict)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        sx, sy = (int(p) for p in args.heartbeat.split(","))
    except ValueError:
        parser.error("--heartbeat expects SEND,RECV milliseconds")
    broker = Broker.open(args.url)

    async def run() -> None:
        server = StompServer(broker, host=args.host, port=args.port, users=_users(args.user), heartbeat=(sx, sy),
                             max_frame_size=args.max_frame_size, prefetch=args.prefetch,
                             selector_string_numbers=args.selector_string_numbers)
        await server.start()
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
