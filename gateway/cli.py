"""The ``b2bgw`` command line.

::

    b2bgw [-c FILE] serve [--host H] [--port P]          serve the HTTP API (+ workers, reconciler, nightly load)
    b2bgw serve --processes N                           ... from N processes on one port and store (0: one per CPU)
    b2bgw stomp [--host H] [--port P]                   run only the STOMP listener
    b2bgw worker                                        run only the configured handler workers
    b2bgw send FILE --partner P                         submit a document as partner P; print the receipt or reply
    b2bgw send FILE --url URL --key KEY                 ... or post it to a running gateway
    b2bgw queues                                        depth, in-flight and dead letters of every queue
    b2bgw browse DEST [--selector S] [--limit N]        the messages waiting in a queue
    b2bgw dlq replay DEST                               move a dead-letter queue's messages back
    b2bgw db upgrade [--url URL]                        run the broker's and the ledger's migrations
    b2bgw db stats | db vacuum [--full]                 table sizes, the next purge; give freed space back
    b2bgw archive run|status|get ID|verify              the ledger's retention: archive and purge (gateway.lifecycle_cli)
    b2bgw routes check                                  check partners, schemas and routes (file:line errors)
    b2bgw rules check RULES.sch DOC.xml... [--json]     run a Schematron rule set on documents (no schema)
    b2bgw key new --id KEY_ID                           make an API key and the hash to configure
    b2bgw operator new --name N [--role operator]       make a console operator's secret and its hash
    b2bgw etl run|status ...                            the warehouse load (when spark_etl is installed)
    b2bgw --version

``-c/--config FILE`` and ``--log-level`` go before or after the command. Without
``-c`` the configuration is ``$B2BGW_CONFIG``, else ``./config/b2bgw.yaml``, else
``./b2bgw.yaml`` (:func:`gateway.config.default_config_path`); none found is an
error, never a file elsewhere. ``$B2BGW_STORE_URL`` overrides the configured
store URL. Exit status: 0 done, 1 failed (a document refused, errors found,
the reason on stderr), 2 a user error (bad arguments, configuration, file,
URL, queue, or a store that cannot be opened: one line on stderr saying what
is wrong and what to do). docs/cli.md is the user's page.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from .config import Settings, default_config_path, load_settings
from .errors import ConfigError, GatewayError
from .logs import own as own_log_handler

__all__ = ["main", "build_parser"]

log = logging.getLogger("gateway.cli")


class CommandError(Exception):
    """Raised by a command for a user error it found (a bad argument, a file
    that cannot be read, an unknown partner or queue...): ``main`` prints the
    message, which says what is wrong and what to do, on one line and exits 2."""


def _settings(args: argparse.Namespace) -> Settings:
    path = getattr(args, "config", None)
    if path is not None and not Path(path).exists():
        raise CommandError(f"-c {path}: no such file; give the path of the gateway's YAML configuration")
    env = os.environ.get("B2BGW_CONFIG")
    if path is None and env and not Path(env).exists():
        raise CommandError(f"$B2BGW_CONFIG={env}: no such file; point it at the gateway's YAML configuration or "
                           "unset it")
    return load_settings(path)


def _err(text: str) -> None:
    print(text, file=sys.stderr)


def _shown_url(url: str) -> str:
    """*url* with any password masked (for logs and messages)."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy parses: nothing to mask there either
        return url


def _one_line(text: Any) -> str:
    return re.sub(r"\[Errno \d+\] ", "", " ".join(str(text).split()))


def _user_error(exc: BaseException) -> str | None:
    """The one-line message for *exc* if it is a user error (exit status 2), else None (a bug: traceback)."""
    from broker_core import InvalidDestinationError, InvalidSelectorError, StoreError, StoreUnavailableError

    if isinstance(exc, CommandError | argparse.ArgumentError | argparse.ArgumentTypeError):
        return _one_line(exc)  # the last two: an option a command checks itself (etl run --since)
    if isinstance(exc, ConfigError):
        return _one_line(f"configuration error: {exc}")
    if isinstance(exc, InvalidSelectorError):
        return _one_line(f"bad selector: {str(exc).splitlines()[0]}; write a JMS (SQL-92) condition on the message "
                         "properties, e.g. \"InvoiceID = 'A-1' AND TotalAmount > 100\"")
    if isinstance(exc, InvalidDestinationError):
        return _one_line(f"{exc}; name a queue as queue://NAME or NAME")
    if isinstance(exc, StoreError):
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        for word in text.split():  # the store's message quotes its URL, password included
            if "://" in word:
                text = text.replace(word.rstrip(":,;"), _shown_url(word.rstrip(":,;")))
        if isinstance(exc, StoreUnavailableError):
            text += "; check store.url in the configuration (or $B2BGW_STORE_URL) and that the database is running"
        return _one_line(text)
    import sqlalchemy.exc

    if isinstance(exc, sqlalchemy.exc.ArgumentError):
        return _one_line(f"the store URL cannot be used: {str(exc).splitlines()[0]}; write it as sqlite:///PATH or "
                         "postgresql+psycopg://USER@HOST/DB")
    if isinstance(exc, sqlalchemy.exc.OperationalError):
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        return _one_line(f"cannot use the database: {reason}; check the store URL and that the database is running")
    if isinstance(exc, OSError) and exc.filename is not None:
        return _one_line(f"{exc.filename}: {exc.strerror or exc}; check the path and its permissions")
    return None


# --------------------------------------------------------------------------- serve and worker


def _freeze_startup_objects() -> None:
    """Move everything built so far (the compiled schemas, routes, partners: a few hundred thousand
    long-lived objects) out of the garbage collector's sight: a full collection would otherwise walk them
    all, a pause of about 0.1 s in the middle of some request, every so often."""
    import gc

    gc.collect()
    gc.freeze()


#: The sample partners' API keys, published in the README: anyone can use them.
_DEMO_KEYS = (
    "acme-demo.EOSR0zYti7vSYAzgLvqVss8uQCIXEmWO3fDuUsmKiIA",
    "globex-demo.gtQ0VQHxnHu2x3aBBqlE_TqHsM5svX9Dzw52xGagUfA",
)


def is_loopback(host: str) -> bool:
    """Whether listening on *host* keeps the server reachable from this machine only."""
    import ipaddress

    name = host.strip().strip("[]")
    if name.lower() == "localhost" or name.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:  # a host name (or "", all addresses): it may resolve anywhere
        return False


def demo_keys_configured(settings: Settings) -> list[str]:
    """The ids of the published demo keys that would authenticate with *settings*' partners."""
    from .partners import PartnerRegistry, verify_key

    registry = PartnerRegistry.from_settings(settings)
    found = []
    for demo in _DEMO_KEYS:
        key_id = demo.split(".", 1)[0]
        key = registry.keys.get(key_id)
        if key is None:
            continue
        partner = registry.get(key.partner)
        if partner is not None and partner.enabled and verify_key(demo, key.hash):
            found.append(key_id)
    return found


def _check_can_serve(settings: Settings, host: str, port: int, stomp: bool = True) -> None:
    """Refuse, before anything starts, what would make ``serve`` fail or be unsafe at start-up."""
    import importlib

    from .runtime import stomp_options

    listener = stomp_options(settings) if stomp else None
    if listener is not None and not listener.get("users") and not is_loopback(listener["host"]):
        raise CommandError(
            f"refusing to start the STOMP listener on {listener['host']}: without stomp.users in "
            f"{_config_shown(settings)} it accepts any login, and anyone who reaches it could read every partner's "
            "documents; add users: {LOGIN: PASSCODE} to the stomp section, listen on 127.0.0.1, or serve with "
            "--no-stomp")

    if not is_loopback(host):
        demo = demo_keys_configured(settings)
        if demo:
            raise CommandError(
                f"refusing to listen on {host}: the partners of {_config_shown(settings)} still accept the "
                f"published demo key{'s' if len(demo) > 1 else ''} {', '.join(demo)}; make new keys with "
                "`b2bgw key new --id KEY_ID`, put their hashes in place of the demo ones, or listen on 127.0.0.1")
    _probe_listen(host, port)
    for module in settings.workers:  # imported now rather than in the middle of the start-up
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise settings.workers_where.error(f"worker module {module!r} cannot be imported: {exc}") from None


def _probe_listen(host: str, port: int) -> None:
    """CommandError if *host*:*port* cannot be listened on (bound here as uvicorn and the STOMP listener bind it)."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except socket.gaierror as exc:
        raise CommandError(f"cannot listen on {host}: {exc.strerror}; give --host an IP address of this machine "
                           "or a name it resolves (127.0.0.1: this machine only)") from None
    except OSError as exc:
        raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; stop what uses that port or "
                           "choose another with --port") from None


def _config_shown(settings: Settings) -> str:
    return str(Path(settings.config_path).resolve()) if settings.config_path is not None else "the configuration"


def cmd_serve(args: argparse.Namespace) -> int:
    from .logs import configure

    settings = _settings(args)
    configure(settings.log_format, getattr(logging, args.log_level, logging.INFO), args.process_index)
    host = args.host or settings.host
    port = settings.port if args.port is None else args.port
    if args.listen_fd is None:
        from .processes import process_count

        _check_can_serve(settings, host, port, stomp=not args.no_stomp)
        count = process_count(settings, args.processes)
        if count > 1:
            return _supervise(args, settings, count, host, port)
        from .runtime import open_broker

        open_broker(settings, sweep_interval=0).close()  # a store that cannot open fails here, not in the lifespan
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
        log.info("serving %d routes for %d partners on http://%s:%d (configuration %s, store %s)",
                 len(app.state.assembly.routes), len(app.state.assembly.partners.partners), host, port,
                 _config_shown(settings), _shown_url(settings.store_url))
    _freeze_startup_objects()
    options = dict(log_level=args.log_level.lower(), access_log=not args.no_access_log, lifespan="on",
                   timeout_graceful_shutdown=10, log_config=uvicorn_log_config())
    if args.listen_fd is None:
        uvicorn.run(app, host=host, port=port, **options)
    else:
        import socket

        sock = socket.socket(fileno=args.listen_fd)  # the supervisor's socket (uvicorn listens once started)
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
    log.info("serving on http://%s:%d from %d processes%s (configuration %s, store %s)", host, bound, count,
             ", each bound to one CPU" if pin else "", _config_shown(settings), _shown_url(settings.store_url))
    return supervisor.run()


def _child_args(args: argparse.Namespace, settings: Settings) -> list[str]:
    out = ["--log-level", args.log_level, "serve"]
    if settings.config_path is not None:
        out += ["--config", str(Path(settings.config_path).resolve())]
    for flag in ("no_workers", "no_etl", "no_access_log", "no_stomp", "noop_endpoint"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    return out


def cmd_stomp(args: argparse.Namespace) -> int:
    import asyncio

    from .runtime import open_broker, start_stomp, stomp_options

    settings = _settings(args)
    if args.port is not None or args.host is not None:
        settings.stomp = {**(settings.stomp or {}), **({"port": args.port} if args.port is not None else {}),
                          **({"host": args.host} if args.host is not None else {}), "enabled": True}
    options = stomp_options(settings)
    if options is None:
        raise CommandError(f"the STOMP listener is disabled (stomp.enabled: false in {settings.config_path}); "
                           "enable it there or pass --port")
    _probe_listen(options["host"], options["port"])
    broker = open_broker(settings)

    async def run() -> None:
        server = await start_stomp(settings, broker)
        if server is None:
            raise CommandError("the STOMP listener did not start (the reason is logged above); choose a free port "
                               "with --port")
        print(f"STOMP listener on {server.host}:{server.port} (store {_shown_url(settings.store_url)})", flush=True)
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
        raise CommandError(f"{settings.config_path}: no 'workers:' are configured, so there is nothing to run; list "
                           "handler modules under 'workers:' (e.g. - gateway.samples.order_responder)")
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
        raise CommandError("--url needs --key KEY (or $B2BGW_API_KEY): the partner's API key")
    try:
        base = httpx.URL(args.url)
    except httpx.InvalidURL as exc:
        base = None
        reason = str(exc)
    else:
        reason = "it needs http:// or https:// and a host"
    if base is None or base.scheme not in ("http", "https") or not base.host:
        raise CommandError(f"--url {args.url!r} is not a gateway URL ({reason}); give its base URL, e.g. "
                           "http://127.0.0.1:8080")
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/xml"}
    if args.correlation_id:
        headers["X-Correlation-ID"] = args.correlation_id
    if args.idempotency_key:
        headers["Idempotency-Key"] = args.idempotency_key
    url = args.url.rstrip("/") + "/v1/documents"
    try:
        response = httpx.post(url, content=body, headers=headers, timeout=args.timeout)
    except httpx.TimeoutException:
        _err(f"no answer from {url} within {args.timeout:g} s: the document may or may not have been accepted; "
             "send it again with the same --idempotency-key, or a larger --timeout")
        return 1
    except httpx.HTTPError as exc:
        raise CommandError(f"cannot reach {url}: {_one_line(exc) or type(exc).__name__}; is the gateway running "
                           "there (b2bgw serve)? check --url") from None
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
        raise CommandError(f"{path}: {exc.strerror or exc}; give the path of the XML document to send") from None
    if args.url:
        return _send_http(args, body)
    if not args.partner:
        raise CommandError("send needs --partner P (or --url URL --key KEY to post to a running gateway)")

    from .assemble import assemble_or_raise
    from .problems import problem_body
    from .runtime import Runtime

    settings = _settings(args)
    assembly = assemble_or_raise(settings)
    partner = assembly.partners.get(args.partner)
    if partner is None:
        raise CommandError(f"no partner {args.partner!r} is configured in {settings.config_path}; use one of: "
                           f"{', '.join(sorted(assembly.partners.partners)) or '(none)'}")
    if len(body) > settings.limits.max_bytes:
        _err(f"{path}: {len(body)} bytes is over the {settings.limits.max_bytes} bytes limit (limits.max_body_bytes): "
             "the gateway refuses it")
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
        names |= _route_queues(settings)
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


def _route_queues(settings: Settings) -> set[str]:
    """The queues the configured routes send to."""
    names = set()
    for item in settings.routes:
        if isinstance(item, dict) and isinstance(item.get("destination"), str):
            dest = item["destination"].strip()
            if dest.startswith("queue://"):
                names.add(dest)
    return names


def _require_known(settings: Settings, broker: Any, *queues: Any) -> None:
    """CommandError unless one of *queues* is routed to or has something in the store (a mistyped name)."""
    known = {s.name for s in broker.destinations()} | _route_queues(settings)
    if any(str(queue) in known for queue in queues):
        return
    shown = sorted(name for name in known if name.startswith("queue://"))
    listed = ", ".join(shown[:8]) + (", ..." if len(shown) > 8 else "") if shown else "none yet"
    raise CommandError(f"no queue {queues[0]} is known: no route sends to it and the store holds nothing for it; "
                       f"check the name (known queues: {listed}; `b2bgw queues` lists them)")


def _queue_name(text: str) -> Any:
    from broker_core import InvalidDestinationError, Queue, parse_destination

    try:
        dest = parse_destination(text) if "://" in text else Queue(text)
    except InvalidDestinationError as exc:
        raise CommandError(f"{text!r}: {exc}; name a queue as queue://NAME or NAME") from None
    if dest.is_topic or dest.is_temporary:
        raise CommandError(f"{text}: only queues can be browsed or replayed (not topics or temporary queues); "
                           "name one as queue://NAME or NAME")
    return dest


def _browse(broker: Any, queue: Any, selector: str | None, limit: int) -> Any:
    """The broker's browse, a bad selector reported as the user's (it is compiled before the first message)."""
    from broker_core import InvalidSelectorError

    try:
        yield from broker.browse(queue, selector, limit)
    except InvalidSelectorError as exc:
        raise CommandError(f"--selector {selector!r}: {str(exc).splitlines()[0]}; write a JMS (SQL-92) condition on "
                           "the message properties, e.g. \"InvoiceID = 'A-1' AND TotalAmount > 100\"") from None


def cmd_browse(args: argparse.Namespace) -> int:
    queue = _queue_name(args.destination)
    settings, broker = _open(args)
    try:
        count = 0
        for message in _browse(broker, queue, args.selector, args.limit):
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
        if not count:  # after the selector's check: a bad selector is reported whatever the queue
            _require_known(settings, broker, queue)
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
        _require_known(settings, broker, queue, dlq)
        ids = [m.jms_message_id for m in broker.browse(dlq)]
        moved = broker.replay_dead_letters(dlq)
        reconciler = Reconciler(broker, Ledger(broker.engine))
        reset = reconciler.after_replay(ids)
        print(f"moved {moved} message{'s' if moved != 1 else ''} from {dlq} back to their queue; "
              f"{reset} ledger document{'s' if reset != 1 else ''} back to 'accepted'")
    finally:
        broker.close()
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from broker_core.sql import make_engine, upgrade_database

    from .ledger import upgrade_ledger

    url = args.url or os.environ.get("B2BGW_STORE_URL") or _settings(args).store_url
    if not url.startswith(("sqlite:", "postgresql")):
        raise CommandError(f"{_shown_url(url)}: only SQL stores have migrations; give a sqlite:///PATH or "
                           "postgresql+psycopg://USER@HOST/DB URL")
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
    for name, rule_set in assembly.rules.sets.items():
        compiled = rule_set.compiled
        print(f"  rule set {name}: {len(compiled.assertions)} assertions from {compiled.path}"
              f"{' (phase ' + compiled.phase + ')' if compiled.phase else ''}")
    return 0


def cmd_rules_check(args: argparse.Namespace) -> int:
    """Run one Schematron rule set on documents: exit 0 when none fails a rule of flag fatal, error or none,
    1 when one does (or cannot be read), 2 when the rule file cannot be used."""
    from .schematron import SaxonRules, SchematronError, default_cache_dir, document_text, load_schematron
    from .xmlintake import parse_document_text

    rules = SaxonRules()
    cache = None if args.no_cache else (Path(args.cache_dir) if args.cache_dir else default_cache_dir())
    try:
        compiled = load_schematron(args.rules, args.phase, cache_dir=cache, check=rules)
        rules.add(compiled)
    except SchematronError as exc:
        for err in exc.errors:
            _err(str(err))
        return 2
    except ConfigError as exc:
        _err(str(exc))
        return 2
    rules.lock()
    status = 0
    for name in args.documents:
        try:
            root, decoded = parse_document_text(Path(name).read_bytes())
            findings = rules.run(document_text(root, decoded))
        except OSError as exc:
            _err(f"{name}: {exc.strerror or exc}")
            status = 1
            continue
        except GatewayError as exc:  # not well-formed, a DOCTYPE, too large...
            _err(f"{name}: {exc}")
            status = 1
            continue
        except rules._saxon.PySaxonApiError as exc:
            _err(f"{name}: the rules failed on this document: {' '.join(str(exc).split())[:300]}")
            status = 1
            continue
        failed = [f for f in findings if f.failed_assert]
        reports = [f for f in findings if not f.failed_assert]
        if any(f.is_error for f in findings):
            status = 1
        if args.json:
            print(json.dumps({"document": name, "failed": [f.to_dict() for f in failed],
                              "reports": [f.to_dict() for f in reports]}, ensure_ascii=False))
            continue
        errors = sum(1 for f in findings if f.is_error)
        print(f"{name}: {'FAILED' if errors else 'ok'} ({errors} error{'s' if errors != 1 else ''}, "
              f"{len(findings) - errors} warning{'s' if len(findings) - errors != 1 else ''} or reports)")
        for f in findings:
            kind = "failed" if f.failed_assert else "report"
            print(f"  {kind} {f.assertion.id or '-'} [{f.assertion.flag or 'no flag'}] {f.location}: {f.text}")
    return status


def cmd_key_new(args: argparse.Namespace) -> int:
    from .partners import generate_key, hash_key

    try:
        key = generate_key(args.id)
    except ValueError as exc:
        raise CommandError(f"{exc}; choose another --id, e.g. acme-2025") from None
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


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line saying where to look (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}; see `{self.prog} --help`\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extra = super().parse_known_args(args, namespace)
        if not hasattr(parsed, "_parser_prog"):  # the innermost (sub)command parser returns first
            parsed._parser_prog = self.prog
        return parsed, extra

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:  # reported by the command they were given to, not by `b2bgw`
            prog = getattr(parsed, "_parser_prog", self.prog)
            self.exit(2, f"{prog}: unrecognized arguments: {' '.join(extra)}; see `{prog} --help`\n")
        return parsed


class _VersionAction(argparse.Action):
    """``--version``: the installed package's version (looked up only when asked)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("b2bgw")
        except PackageNotFoundError:  # run from a source tree that is not installed
            text = "unknown (not installed: pip install -e .)"
        sys.stdout.write(f"b2bgw {text}\n")
        parser.exit(0)


def _int_at_least(minimum: int, what: str) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number ({what})") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is out of range ({what})")
        return value

    return parse


def _port(text: str) -> int:
    value = _int_at_least(0, "a TCP port, 0 to 65535")(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is out of range (a TCP port, 0 to 65535)")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


_LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="b2bgw", description="B2B XML integration gateway",
                     epilog="Exit status: 0 done, 1 failed, 2 a user error (the reason on stderr). "
                            "Configuration without -c: $B2BGW_CONFIG, else ./config/b2bgw.yaml, else ./b2bgw.yaml.")
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    # -c and --log-level go before or after the command; each command keeps its own copy (same meaning) so
    # that `b2bgw serve -c FILE` and `b2bgw -c FILE serve` both work; main() merges them (the command's wins).
    parser.add_argument("-c", "--config", dest="global_config", metavar="FILE",
                        help="the configuration file (default: $B2BGW_CONFIG, ./config/b2bgw.yaml, ./b2bgw.yaml)")
    parser.add_argument("--log-level", dest="global_log_level", choices=_LOG_LEVELS, type=str.upper,
                        help="log level (default: $B2BGW_LOG_LEVEL, else INFO)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def with_log_level(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--log-level", choices=_LOG_LEVELS, type=str.upper,
                       help="log level (default: $B2BGW_LOG_LEVEL, else INFO)")
        return p

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("-c", "--config", metavar="FILE",
                       help="the configuration file (default: $B2BGW_CONFIG, ./config/b2bgw.yaml, ./b2bgw.yaml)")
        return with_log_level(p)

    def needs_action(group: argparse.ArgumentParser, name: str) -> Any:
        actions = group.add_subparsers(dest=f"{name}_command", metavar="ACTION")

        def missing(_args: argparse.Namespace) -> int:
            raise CommandError(f"choose an action: {', '.join(actions.choices)}; see `b2bgw {name} --help`")

        group.set_defaults(func=missing)
        return actions

    p = with_config(sub.add_parser("serve", help="serve the HTTP API"))
    p.add_argument("--host", help="listen address (default: server.host, 127.0.0.1)")
    p.add_argument("--port", type=_port, help="listen port (default: server.port, 8080; 0: any free port)")
    p.add_argument("--no-workers", action="store_true", help="do not run the configured handler workers")
    p.add_argument("--no-etl", action="store_true",
                   help="do not schedule the nightly warehouse load, nor the ledger's archive job")
    p.add_argument("--no-access-log", action="store_true", help="do not log each request")
    p.add_argument("--no-stomp", action="store_true", help="do not start the STOMP listener (stomp: section)")
    p.add_argument("--processes", type=_int_at_least(0, "0: one per CPU"), metavar="N",
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
    p.add_argument("--port", type=_port, help="listen port (default: stomp.port, 61613)")
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
    p.add_argument("--timeout", type=_seconds, default=60.0, help="HTTP timeout in seconds, with --url")
    p.set_defaults(func=cmd_send)

    p = with_config(sub.add_parser("queues", help="depth, in-flight and dead letters of every queue"))
    p.set_defaults(func=cmd_queues)

    p = with_config(sub.add_parser("browse", help="the messages waiting in a queue"))
    p.add_argument("destination", help="queue://NAME or NAME")
    p.add_argument("--selector", help="a JMS message selector")
    p.add_argument("--limit", type=_int_at_least(1, "at least 1"), default=20,
                   help="at most this many messages (default 20)")
    p.add_argument("--body", action="store_true", help="print whole bodies")
    p.set_defaults(func=cmd_browse)

    dlq = needs_action(sub.add_parser("dlq", help="dead-letter queues"), "dlq")
    p = with_config(dlq.add_parser("replay", help="move a dead-letter queue's messages back to their queue"))
    p.add_argument("destination", help="the dead-letter queue (queue://DLQ.NAME) or the queue it is for")
    p.set_defaults(func=cmd_dlq)

    db = needs_action(sub.add_parser("db", help="database"), "db")
    p = with_config(db.add_parser("upgrade", help="run the broker store's and the ledger's migrations"))
    p.add_argument("--url", help="the store URL (default: the configured store.url)")
    p.set_defaults(func=cmd_db_upgrade)

    from .lifecycle_cli import register as register_lifecycle  # db stats, db vacuum, archive ...

    register_lifecycle(sub, db, with_config, needs_action)

    routes = needs_action(sub.add_parser("routes", help="routes"), "routes")
    p = with_config(routes.add_parser("check", help="check partners, schemas and routes"))
    p.set_defaults(func=cmd_routes_check)

    rules = needs_action(sub.add_parser("rules", help="business rules"), "rules")
    p = with_log_level(rules.add_parser("check", help="run a Schematron rule set on documents (no schema validation)"))
    p.add_argument("rules", metavar="RULES.sch", help="the ISO Schematron rule file")
    p.add_argument("documents", metavar="DOC.xml", nargs="+", help="documents to check")
    p.add_argument("--phase", help="the phase to run (default: the schema's defaultPhase, else every pattern)")
    p.add_argument("--json", action="store_true", help="one JSON object per document per line")
    p.add_argument("--cache-dir", help="where compiled rule sets are kept (default: ~/.cache/b2bgw/rules)")
    p.add_argument("--no-cache", action="store_true", help="compile the rule set without the cache")
    p.set_defaults(func=cmd_rules_check)

    key = needs_action(sub.add_parser("key", help="API keys"), "key")
    p = with_log_level(key.add_parser("new", help="make a new API key and print the hash to configure"))
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


def _command_name(args: argparse.Namespace) -> str:
    words = ["b2bgw"]
    command = getattr(args, "command", None)
    if command:
        words.append(command)
        action = getattr(args, f"{command}_command", None)
        if isinstance(action, str):
            words.append(action)
    return " ".join(words)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    if getattr(args, "config", None) is None:  # given before the command (or not at all)
        args.config = args.global_config
    if args.config is None and args.command == "etl":  # the warehouse load looks where the other commands look
        found = default_config_path()
        args.config = None if found is None else str(found)
    level = getattr(args, "log_level", None) or args.global_log_level or os.environ.get("B2BGW_LOG_LEVEL", "INFO")
    args.log_level = level.upper() if level.upper() in _LOG_LEVELS else "INFO"
    index = getattr(args, "process_index", None)
    before = set(logging.getLogger().handlers)
    logging.basicConfig(level=getattr(logging, args.log_level, logging.INFO),
                        format="%(asctime)s %(levelname)s " + ("" if index is None else f"[process {index}] ")
                        + "%(name)s: %(message)s")
    for handler in set(logging.getLogger().handlers) - before:  # serve's logging.format replaces it
        own_log_handler(handler)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if args.command not in ("serve", "worker"):
        logging.getLogger().setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        return int(func(args) or 0)
    except GatewayError as exc:
        if not isinstance(exc, ConfigError):  # a document refused
            _err(str(exc))
            return 1
        _err(f"{_command_name(args)}: {_user_error(exc)}")
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        text = _user_error(exc)
        if text is None:  # a bug: its traceback is what helps
            raise
        _err(f"{_command_name(args)}: {text}")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
