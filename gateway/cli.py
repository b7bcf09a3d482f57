"""The ``b2bgw`` command line.

::

    b2bgw serve [--config FILE] [--host H] [--port P]   serve the HTTP API (+ workers, reconciler, nightly load)
    b2bgw serve --processes N                           ... from N processes on one port and store (0: one per CPU)
    b2bgw worker [--config FILE]                        run only the configured handler workers
    b2bgw send FILE --partner P [--config FILE]         submit a document as partner P; print the receipt or reply
    b2bgw send FILE --url URL --key KEY                 ... or post it to a running gateway
    b2bgw queues [--config FILE]                        depth, in-flight and dead letters of every queue
    b2bgw browse DEST [--selector S] [--limit N]        the messages waiting in a queue
    b2bgw dlq replay DEST                               move a dead-letter queue's messages back
    b2bgw db upgrade [--url URL]                        run the broker's and the ledger's migrations
    b2bgw routes check [--config FILE]                  check partners, schemas and routes (file:line errors)
    b2bgw key new --id KEY_ID                           make an API key and the hash to configure
    b2bgw operator new --name N [--role operator]       make a console operator's secret and its hash
    b2bgw etl run|status ...                            the warehouse load (when spark_etl is installed)

Without ``--config`` the configuration is ``$B2BGW_CONFIG``, else
``./config/b2bgw.yaml``, else the sample configuration of this checkout.
``$B2BGW_STORE_URL`` overrides the configured store URL. Exit status: 0 done,
1 failed (the reason on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from .config import Settings, load_settings
from .errors import ConfigError, GatewayError

__all__ = ["main", "build_parser"]

log = logging.getLogger("gateway.cli")


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(args.config)


def _err(text: str) -> None:
    print(text, file=sys.stderr)


# --------------------------------------------------------------------------- serve and worker


def _freeze_startup_objects() -> None:
    """Move everything built so far (the compiled schemas, routes, partners: a few hundred thousand
    long-lived objects) out of the garbage collector's sight: a full collection would otherwise walk them
    all, a pause of about 0.1 s in the middle of some request, every so often."""
    import gc

    gc.collect()
    gc.freeze()


def cmd_serve(args: argparse.Namespace) -> int:
    from .logs import configure

    settings = _settings(args)
    configure(settings.log_format, getattr(logging, args.log_level, logging.INFO), args.process_index)
    host = args.host or settings.host
    port = settings.port if args.port is None else args.port
    if args.listen_fd is None:
        from .processes import process_count

        count = process_count(settings, args.processes)
        if count > 1:
            return _supervise(args, settings, count, host, port)
    return _serve_one(args, settings, host, port)


def _serve_one(args: argparse.Namespace, settings: Settings, host: str, port: int) -> int:
    """Serve in this process: alone, or as serving process ``--process-index`` of a supervisor."""
    import uvicorn

    from .app import create_app
    from .logs import uvicorn_log_config

    index = args.process_index
    if args.cpu is not None:
        from .processes import pin_to

        pin_to(args.cpu)  # before any thread starts: they all inherit it
    first = index in (None, 0)  # the STOMP port is bound once; one process schedules the nightly load
    app = create_app(settings, workers=not args.no_workers, etl=first and not args.no_etl,
                     stomp=first and not args.no_stomp,
                     noop_endpoint=args.noop_endpoint or os.environ.get("B2BGW_NOOP_ENDPOINT") == "1",
                     freeze_gc=True, on_started=_ready_writer(args.ready_fd), admin_listener=first)
    if index is None:
        log.info("serving %d routes for %d partners on http://%s:%d (store %s)", len(app.state.assembly.routes),
                 len(app.state.assembly.partners.partners), host, port, settings.store_url)
    _freeze_startup_objects()
    options = dict(log_level=args.log_level.lower(), access_log=not args.no_access_log, lifespan="on",
                   timeout_graceful_shutdown=10, log_config=uvicorn_log_config())
    if args.listen_fd is None:
        uvicorn.run(app, host=host, port=port, **options)
    else:
        import socket

        sock = socket.socket(fileno=args.listen_fd)  # the supervisor's listening socket (family detected)
        uvicorn.Server(uvicorn.Config(app, **options)).run(sockets=[sock])
    return 0


def _ready_writer(fd: int | None):
    """Tell the supervisor on *fd* that this serving process has started (once), or None."""
    if fd is None:
        return None

    def ready() -> None:
        try:
            os.write(fd, b"1")
            os.close(fd)
        except OSError:  # the supervisor is gone: it will not need to know
            pass

    return ready


def _supervise(args: argparse.Namespace, settings: Settings, count: int, host: str, port: int) -> int:
    from .processes import Supervisor
    from .runtime import open_broker

    pin = settings.pin_processes if args.pin_processes is None else args.pin_processes
    supervisor = Supervisor(settings, count, host=host, port=port, child_args=_child_args(args, settings), pin=pin)
    open_broker(settings).close()  # migrations run once, and a store that cannot open fails here
    bound = supervisor.bind()  # the port asked for, or the one the system gave for 0
    log.info("serving %s on http://%s:%d from %d processes%s (store %s)", settings.config_path or "the configuration",
             host, bound, count, ", each bound to one CPU" if pin else "", settings.store_url)
    return supervisor.run()


def _child_args(args: argparse.Namespace, settings: Settings) -> list[str]:
    out = ["--log-level", args.log_level, "serve"]
    if settings.config_path is not None:
        out += ["--config", str(settings.config_path)]
    for flag in ("no_workers", "no_etl", "no_access_log", "no_stomp", "noop_endpoint"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    return out


def cmd_stomp(args: argparse.Namespace) -> int:
    import asyncio

    from .runtime import open_broker, start_stomp

    settings = _settings(args)
    if args.port is not None or args.host is not None:
        settings.stomp = {**(settings.stomp or {}), **({"port": args.port} if args.port is not None else {}),
                          **({"host": args.host} if args.host is not None else {}), "enabled": True}
    broker = open_broker(settings)

    async def run() -> None:
        server = await start_stomp(settings, broker)
        if server is None:
            raise SystemExit("the STOMP listener did not start (see the log above)")
        print(f"STOMP listener on {server.host}:{server.port} (store {settings.store_url})", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    finally:
        broker.close()
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    import signal
    import threading

    from .assemble import Assembly
    from .partners import PartnerRegistry
    from .routes import RouteTable
    from .runtime import Runtime
    from .schemas import SchemaRegistry

    settings = _settings(args)
    if not settings.workers:
        _err(f"{settings.config_path}: no 'workers:' are configured; nothing to run")
        return 1
    assembly = Assembly(settings, SchemaRegistry(), PartnerRegistry({}, {}), RouteTable([]))
    runtime = Runtime(assembly, workers=True, etl=False, reconcile=False, gateway=False)
    runtime.start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    log.info("running workers %s on %s; Ctrl-C stops", ", ".join(settings.workers), settings.store_url)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        runtime.stop()
    return 0


# --------------------------------------------------------------------------- send


def _print_outcome(outcome: Any) -> None:
    if outcome.reply is not None:
        sys.stdout.write(outcome.reply.decode("utf-8", errors="replace"))
        if not outcome.reply.endswith(b"\n"):
            sys.stdout.write("\n")
        _err(f"message id {outcome.message_id}, correlation id {outcome.correlation_id}, route {outcome.route}")
    else:
        print(json.dumps(outcome.receipt, indent=2))


def _send_http(args: argparse.Namespace, body: bytes) -> int:
    import httpx

    key = args.key or os.environ.get("B2BGW_API_KEY")
    if not key:
        _err("--url needs --key KEY (or $B2BGW_API_KEY): the partner's API key")
        return 2
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/xml"}
    if args.correlation_id:
        headers["X-Correlation-ID"] = args.correlation_id
    if args.idempotency_key:
        headers["Idempotency-Key"] = args.idempotency_key
    url = args.url.rstrip("/") + "/v1/documents"
    try:
        response = httpx.post(url, content=body, headers=headers, timeout=args.timeout)
    except httpx.HTTPError as exc:
        _err(f"cannot reach {url}: {exc}")
        return 1
    text = response.text
    if response.status_code in (200, 202):
        print(text if response.status_code == 200 else json.dumps(response.json(), indent=2))
        if response.status_code == 200:
            _err(f"message id {response.headers.get('x-message-id')}, "
                 f"correlation id {response.headers.get('x-correlation-id')}")
        return 0
    _err(f"HTTP {response.status_code}")
    _err(text)
    return 1


def cmd_send(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        body = path.read_bytes()
    except OSError as exc:
        _err(f"{path}: {exc.strerror or exc}")
        return 1
    if args.url:
        return _send_http(args, body)
    if not args.partner:
        _err("send needs --partner P (or --url URL --key KEY to post to a running gateway)")
        return 2

    from .assemble import assemble_or_raise
    from .problems import problem_body
    from .runtime import Runtime

    settings = _settings(args)
    assembly = assemble_or_raise(settings)
    partner = assembly.partners.get(args.partner)
    if partner is None:
        _err(f"no partner {args.partner!r} is configured (partners: {', '.join(sorted(assembly.partners.partners))})")
        return 1
    if len(body) > settings.limits.max_bytes:
        _err(f"{path}: {len(body)} bytes is over the {settings.limits.max_bytes} bytes limit")
        return 1
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    try:
        assert runtime.gateway is not None
        outcome = asyncio.run(runtime.gateway.submit(partner, body, correlation_id=args.correlation_id,
                                                     idempotency_key=args.idempotency_key))
    except GatewayError as exc:
        _err(json.dumps(problem_body(exc), indent=2, ensure_ascii=False))
        return 1
    finally:
        runtime.stop()
    _print_outcome(outcome)
    return 0


# --------------------------------------------------------------------------- broker introspection


def _open(args: argparse.Namespace) -> Any:
    from .runtime import open_broker

    settings = _settings(args)
    return settings, open_broker(settings, sweep_interval=0)


def cmd_queues(args: argparse.Namespace) -> int:
    settings, broker = _open(args)
    try:
        stats = {s.name: s for s in broker.destinations()}
        prefix = f"queue://{broker.policy.dead_letter_prefix}"
        names = {name for name in stats if name.startswith("queue://") and not name.startswith(prefix)}
        for item in settings.routes:
            if isinstance(item, dict) and isinstance(item.get("destination"), str):
                dest = item["destination"].strip()
                if dest.startswith("queue://"):
                    names.add(dest)
        orphans = {name for name in stats if name.startswith(prefix)
                   and "queue://" + name[len(prefix):] not in names}
        rows = [("QUEUE", "DEPTH", "IN-FLIGHT", "DEAD-LETTERS", "CONSUMERS")]
        for name in sorted(names):
            s = stats.get(name)
            dlq = stats.get(prefix + name[len("queue://"):])
            rows.append((name, str(s.depth if s else 0), str(s.in_flight if s else 0),
                         str(dlq.depth if dlq else 0), str(s.consumers) if s and s.consumers else "-"))
        for name in sorted(orphans):
            s = stats[name]
            rows.append((name, str(s.depth), str(s.in_flight), "-", "-"))
        topics = sorted(n for n, s in stats.items() if s.topic)
        for name in topics:
            s = stats[name]
            rows.append((f"{name} ({s.topic})", str(s.depth), str(s.in_flight), "-", "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for r in rows:
            print("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
        print("(consumers of every process sharing the store, as of their last heartbeat, about a second ago)")
    finally:
        broker.close()
    return 0


def _queue_name(text: str) -> Any:
    from broker_core import InvalidDestinationError, Queue, parse_destination

    try:
        dest = parse_destination(text) if "://" in text else Queue(text)
    except InvalidDestinationError as exc:
        raise ConfigError(str(exc)) from None
    if dest.is_topic or dest.is_temporary:
        raise ConfigError(f"{text}: only (non-temporary) queues can be browsed or replayed")
    return dest


def cmd_browse(args: argparse.Namespace) -> int:
    queue = _queue_name(args.destination)
    settings, broker = _open(args)
    try:
        count = 0
        for message in broker.browse(queue, args.selector, args.limit):
            count += 1
            props = {name: message.get_object_property(name) for name in message.property_names()}
            print(f"{message.jms_message_id}  priority {message.jms_priority}  "
                  f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(message.jms_timestamp / 1000))}  "
                  f"type {message.jms_type or '-'}  correlation {message.jms_correlation_id or '-'}")
            print(f"  properties {json.dumps(props, default=str, ensure_ascii=False)}")
            text = getattr(message, "text", None)
            if text is not None:
                shown = text if args.body else text[:200].replace("\n", " ") + ("..." if len(text) > 200 else "")
                print(f"  body {shown}")
        print(f"{count} message{'s' if count != 1 else ''} in {queue}")
    finally:
        broker.close()
    return 0


def cmd_dlq(args: argparse.Namespace) -> int:
    from broker_core import Queue

    from .ledger import Ledger
    from .status import Reconciler

    queue = _queue_name(args.destination)
    settings, broker = _open(args)
    try:
        prefix = broker.policy.dead_letter_prefix
        dlq = queue if queue.name.startswith(prefix) else Queue(prefix + queue.name)
        ids = [m.jms_message_id for m in broker.browse(dlq)]
        moved = broker.replay_dead_letters(dlq)
        reconciler = Reconciler(broker, Ledger(broker.store.engine))
        reset = reconciler.after_replay(ids)
        print(f"moved {moved} message{'s' if moved != 1 else ''} from {dlq} back to their queue; "
              f"{reset} ledger document{'s' if reset != 1 else ''} back to 'accepted'")
    finally:
        broker.close()
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from broker_core._sql import upgrade_database
    from broker_core._sql._store import make_engine  # the store's engine setup (WAL, search path)

    from .ledger import upgrade_ledger

    url = args.url or os.environ.get("B2BGW_STORE_URL") or _settings(args).store_url
    if not url.startswith(("sqlite:", "postgresql")):
        _err(f"{url}: only SQL stores have migrations")
        return 1
    broker_revision = upgrade_database(url)
    engine = make_engine(url)
    try:
        ledger_revision = upgrade_ledger(engine)
    finally:
        engine.dispose()
    print(f"broker tables at revision {broker_revision}, ledger tables at revision {ledger_revision}")
    return 0


def cmd_routes_check(args: argparse.Namespace) -> int:
    from .assemble import assemble

    settings = _settings(args)
    assembly = assemble(settings)
    for err in assembly.errors:
        print(f"{err}", file=sys.stderr)
    if assembly.errors:
        _err(f"{len(assembly.errors)} error{'s' if len(assembly.errors) != 1 else ''} in {settings.config_path}")
        return 1
    print(f"{settings.config_path}: OK: {len(assembly.partners.partners)} partners, {len(assembly.routes)} routes, "
          f"{len(assembly.registry.names)} schemas")
    for route in assembly.routes:
        who = "every partner" if route.partners is None else ", ".join(sorted(route.partners))
        print(f"  {route.id}: {route.doc_type} from {who} -> {route.destination} ({route.exchange})")
    return 0


def cmd_key_new(args: argparse.Namespace) -> int:
    from .partners import generate_key, hash_key

    try:
        key = generate_key(args.id)
    except ValueError as exc:
        _err(str(exc))
        return 2
    print(f"API key (give it to the partner; it is not stored anywhere): {key}")
    print("Add under the partner's 'keys:' in partners.yaml:")
    print(f"      - id: {args.id}")
    print(f"        hash: \"{hash_key(key)}\"")
    return 0


def cmd_operator_new(args: argparse.Namespace) -> int:
    import re
    import secrets

    from .partners import hash_key

    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$", args.name):
        _err(f"operator name {args.name!r} must be 1-64 letters, digits, '.', '@', '-' or '_'")
        return 2
    secret = secrets.token_urlsafe(24)
    print(f"Secret for {args.name} (give it to the operator; it is not stored anywhere): {secret}")
    print("Add under 'operators:' in the configuration:")
    print(f"  {args.name}:")
    print(f"    role: {args.role}")
    print(f"    hash: \"{hash_key(secret)}\"")
    return 0


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="b2bgw", description="B2B XML integration gateway")
    parser.add_argument("--log-level", default=os.environ.get("B2BGW_LOG_LEVEL", "INFO"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", "-c", help="the configuration file (default: ./config/b2bgw.yaml)")
        return p

    p = with_config(sub.add_parser("serve", help="serve the HTTP API"))
    p.add_argument("--host", help="listen address (default: server.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default: server.port, 8080)")
    p.add_argument("--no-workers", action="store_true", help="do not run the configured handler workers")
    p.add_argument("--no-etl", action="store_true", help="do not schedule the nightly warehouse load")
    p.add_argument("--no-access-log", action="store_true", help="do not log each request")
    p.add_argument("--no-stomp", action="store_true", help="do not start the STOMP listener (stomp: section)")
    p.add_argument("--processes", type=int, metavar="N",
                   help="serving processes sharing the port and the store (default: server.processes, 1; "
                        "0: one per CPU)")
    pin = p.add_mutually_exclusive_group()
    pin.add_argument("--pin-processes", dest="pin_processes", action="store_true", default=None,
                     help="with several processes, bind each to one CPU (default: server.pin_processes, on)")
    pin.add_argument("--no-pin-processes", dest="pin_processes", action="store_false")
    p.add_argument("--noop-endpoint", action="store_true", help=argparse.SUPPRESS)
    # set by the supervisor for its serving processes (gateway.processes)
    p.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--process-index", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_serve)

    p = with_config(sub.add_parser("stomp", help="run only the STOMP listener on the configured store"))
    p.add_argument("--host", help="listen address (default: stomp.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default: stomp.port, 61613)")
    p.set_defaults(func=cmd_stomp)

    p = with_config(sub.add_parser("worker", help="run only the configured handler workers"))
    p.set_defaults(func=cmd_worker)

    p = with_config(sub.add_parser("send", help="submit a document; print the receipt or the reply"))
    p.add_argument("file", help="the XML document")
    p.add_argument("--partner", "-p", help="send as this partner (in-process, on the configured store)")
    p.add_argument("--url", help="post to the gateway at this base URL instead (needs --key)")
    p.add_argument("--key", help="the partner's API key, with --url (default: $B2BGW_API_KEY)")
    p.add_argument("--correlation-id")
    p.add_argument("--idempotency-key")
    p.add_argument("--timeout", type=float, default=60.0, help="HTTP timeout in seconds, with --url")
    p.set_defaults(func=cmd_send)

    p = with_config(sub.add_parser("queues", help="depth, in-flight and dead letters of every queue"))
    p.set_defaults(func=cmd_queues)

    p = with_config(sub.add_parser("browse", help="the messages waiting in a queue"))
    p.add_argument("destination", help="queue://NAME or NAME")
    p.add_argument("--selector", help="a JMS message selector")
    p.add_argument("--limit", type=int, default=20, help="at most this many messages (default 20)")
    p.add_argument("--body", action="store_true", help="print whole bodies")
    p.set_defaults(func=cmd_browse)

    dlq = sub.add_parser("dlq", help="dead-letter queues").add_subparsers(dest="dlq_command", metavar="ACTION")
    p = with_config(dlq.add_parser("replay", help="move a dead-letter queue's messages back to their queue"))
    p.add_argument("destination", help="the dead-letter queue (queue://DLQ.NAME) or the queue it is for")
    p.set_defaults(func=cmd_dlq)

    db = sub.add_parser("db", help="database").add_subparsers(dest="db_command", metavar="ACTION")
    p = with_config(db.add_parser("upgrade", help="run the broker store's and the ledger's migrations"))
    p.add_argument("--url", help="the store URL (default: the configured store.url)")
    p.set_defaults(func=cmd_db_upgrade)

    routes = sub.add_parser("routes", help="routes").add_subparsers(dest="routes_command", metavar="ACTION")
    p = with_config(routes.add_parser("check", help="check partners, schemas and routes"))
    p.set_defaults(func=cmd_routes_check)

    key = sub.add_parser("key", help="API keys").add_subparsers(dest="key_command", metavar="ACTION")
    p = key.add_parser("new", help="make a new API key and print the hash to configure")
    p.add_argument("--id", required=True, help="the key id (e.g. acme-2025): the part before the dot")
    p.set_defaults(func=cmd_key_new)

    operator = sub.add_parser("operator", help="console operators").add_subparsers(dest="operator_command",
                                                                                 metavar="ACTION")
    p = operator.add_parser("new", help="make an operator's secret and print the hash to configure")
    p.add_argument("--name", required=True, help="the operator's login name")
    p.add_argument("--role", choices=["viewer", "operator"], default="viewer",
                   help="viewer reads; operator also replays, deletes, moves and purges (default: viewer)")
    p.set_defaults(func=cmd_operator_new)

    try:  # the warehouse load adds `etl run` / `etl status` (pyspark is an optional extra)
        from spark_etl.cli import register  # type: ignore[import-not-found]
    except ImportError:
        pass
    else:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    index = getattr(args, "process_index", None)
    logging.basicConfig(level=getattr(logging, args.log_level, logging.INFO),
                        format="%(asctime)s %(levelname)s " + ("" if index is None else f"[process {index}] ")
                        + "%(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if args.command not in ("serve", "worker"):
        logging.getLogger().setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        return int(func(args) or 0)
    except ConfigError as exc:
        _err(f"configuration error: {exc}")
        return 1
    except GatewayError as exc:
        _err(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
