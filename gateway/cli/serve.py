"""``b2bgw serve``, ``b2bgw stomp`` and ``b2bgw worker``: the gateway's long-running processes, and the
checks that refuse an unsafe or impossible start before anything starts."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.cli.support import CommandError, config_shown, int_at_least, port_number, settings_for, shown_url
from gateway.config.loader import Settings

__all__ = ["register", "is_loopback", "demo_keys_configured"]

log = logging.getLogger(__name__)


def register(sub: Any, with_config: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]) -> None:
    """Add ``serve``, ``stomp`` and ``worker`` to the commands (*sub*)."""
    p = with_config(sub.add_parser("serve", help="serve the HTTP API"))
    p.add_argument("--host", help="listen address (default: server.host, 127.0.0.1)")
    p.add_argument("--port", type=port_number, help="listen port (default: server.port, 8080; 0: any free port)")
    p.add_argument("--no-workers", action="store_true", help="do not run the configured handler workers")
    p.add_argument(
        "--no-etl", action="store_true", help="do not schedule the nightly warehouse load, nor the ledger's archive job"
    )
    p.add_argument("--no-access-log", action="store_true", help="do not log each request")
    p.add_argument("--no-stomp", action="store_true", help="do not start the STOMP listener (stomp: section)")
    p.add_argument(
        "--processes",
        type=int_at_least(0, "0: one per CPU"),
        metavar="N",
        help="serving processes sharing the port and the store (default: server.processes, 1; 0: one per CPU)",
    )
    pin = p.add_mutually_exclusive_group()
    pin.add_argument(
        "--pin-processes",
        dest="pin_processes",
        action="store_true",
        default=None,
        help="with several processes, bind each to one CPU (default: server.pin_processes, on)",
    )
    pin.add_argument("--no-pin-processes", dest="pin_processes", action="store_false")
    p.add_argument("--noop-endpoint", action="store_true", help=argparse.SUPPRESS)
    # set by the supervisor for its serving processes (gateway.runtime.processes)
    p.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--process-index", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_serve)

    p = with_config(sub.add_parser("stomp", help="run only the STOMP listener on the configured store"))
    p.add_argument("--host", help="listen address (default: stomp.host, 127.0.0.1)")
    p.add_argument("--port", type=port_number, help="listen port (default: stomp.port, 61613)")
    p.add_argument(
        "--hash-passcode",
        action="store_true",
        help="read a passcode on standard input, print its hash for stomp.users.LOGIN.passcode_hash, exit",
    )
    p.set_defaults(func=cmd_stomp)

    p = with_config(sub.add_parser("worker", help="run only the configured handler workers"))
    p.set_defaults(func=cmd_worker)


def _freeze_startup_objects() -> None:
    """Move everything built so far (the compiled schemas, routes, partners: a few hundred thousand
    long-lived objects) out of the garbage collector's sight: a full collection would otherwise walk them
    all, a pause in the middle of some request, every so often."""
    from broker_core.collector import settle_collector

    settle_collector()


#: Seconds a thread may hold the interpreter lock while another waits for it (see :func:`_serve_one`).
SWITCH_INTERVAL = 0.001

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
    """The ids of the published demo keys that would authenticate with *settings*' partners (a key hashed
    with the server secret is checked against the configured store's)."""
    from gateway.cli.store_secret import store_secret
    from gateway.routing.partners import PartnerRegistry, verify_key
    from gateway.security.keys import is_hmac_hash, verify_hmac

    registry = PartnerRegistry.from_settings(settings)
    found = []
    secret: bytes | None = None
    for demo in _DEMO_KEYS:
        key_id = demo.split(".", 1)[0]
        key = registry.keys.get(key_id)
        if key is None:
            continue
        partner = registry.get(key.partner)
        if partner is None or not partner.enabled:
            continue
        if is_hmac_hash(key.hash):
            secret = secret if secret is not None else store_secret(settings.store_url)
            if verify_hmac(secret, demo, key.hash):
                found.append(key_id)
        elif verify_key(demo, key.hash):
            found.append(key_id)
    return found


def _check_demo_keys(settings: Settings, host: str) -> None:
    """Refuse to serve partners on a non-loopback *host* while the published demo keys would authenticate."""
    if not is_loopback(host):
        demo = demo_keys_configured(settings)
        if demo:
            raise CommandError(
                f"refusing to listen on {host or '0.0.0.0'}: the partners of {config_shown(settings)} still accept "
                f"the published demo key{'s' if len(demo) > 1 else ''} {', '.join(demo)}; make new keys with "
                "`b2bgw key new --id KEY_ID`, put their hashes in place of the demo ones, or listen on 127.0.0.1"
            )


def _check_can_serve(settings: Settings, host: str, port: int, stomp: bool = True) -> None:
    """Refuse, before anything starts, what would make ``serve`` fail or be unsafe at start-up."""
    import importlib

    from gateway.runtime.serving import stomp_options

    _check_demo_keys(settings, host)
    _probe_listen(host, port)
    for module in settings.workers:  # imported now rather than in the middle of the start-up
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise settings.workers_where.error(f"worker module {module!r} cannot be imported: {exc}") from None
    if stomp:  # last: its users' passcodes are generated on first run
        stomp_options(settings)  # a listener without users is refused, on any address


def _probe_listen(host: str, port: int) -> None:
    """CommandError if *host*:*port* cannot be listened on (bound here as uvicorn and the STOMP listener bind it)."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except socket.gaierror as exc:
        raise CommandError(
            f"cannot listen on {host}: {exc.strerror}; give --host an IP address of this machine "
            "or a name it resolves (127.0.0.1: this machine only)"
        ) from None
    except OSError as exc:
        raise CommandError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; stop what uses that port or "
            "choose another with --port"
        ) from None


def cmd_serve(args: argparse.Namespace) -> int:
    from gateway.telemetry.logs import configure

    settings = settings_for(args)
    configure(settings.log_format, getattr(logging, args.log_level, logging.INFO), args.process_index)
    host = args.host or settings.host
    port = settings.port if args.port is None else args.port
    if args.listen_fd is not None and args.process_index in (None, 0) and not args.no_stomp:
        from gateway.runtime.serving import stomp_options

        stomp_options(settings)  # the same refusal of a listener without users as below
    if args.listen_fd is None:
        from gateway.runtime.processes import process_count

        _check_can_serve(settings, host, port, stomp=not args.no_stomp)
        count = process_count(settings, args.processes)
        if count > 1:
            return _supervise(args, settings, count, host, port)
        from gateway.runtime.serving import open_broker

        open_broker(settings, sweep_interval=0).close()  # a store that cannot open fails here, not in the lifespan
    return _serve_one(args, settings, host, port)


def _serve_one(args: argparse.Namespace, settings: Settings, host: str, port: int) -> int:
    """Serve in this process: alone, or as serving process ``--process-index`` of a supervisor."""
    import uvicorn

    from gateway.http.app import create_app
    from gateway.http.edge import protocol_options
    from gateway.runtime.trust_serving import start_reloading, trust_options
    from gateway.telemetry.logs import uvicorn_log_config
    from gateway.trust.peer import TrustMiddleware

    index = args.process_index
    sock = None
    if args.listen_fd is not None:
        import socket

        sock = socket.socket(fileno=args.listen_fd)  # the supervisor's socket (uvicorn listens once started)
        _check_demo_keys(settings, str(sock.getsockname()[0]))  # the address really listened on, whoever bound it
    if args.cpu is not None:
        from gateway.runtime.processes import pin_to

        pin_to(args.cpu)  # before any thread starts: they all inherit it
    first = index in (None, 0)  # the STOMP port is bound once; one process schedules the nightly load
    app = create_app(
        settings,
        workers=not args.no_workers,
        etl=first and not args.no_etl,
        stomp=first and not args.no_stomp,
        noop_endpoint=args.noop_endpoint or os.environ.get("B2BGW_NOOP_ENDPOINT") == "1",
        freeze_gc=True,
        on_started=_ready_writer(args.ready_fd),
        admin_listener=first,
    )
    if index is None:
        log.info(
            "serving %d routes for %d partners on %s://%s:%d (configuration %s, store %s)",
            len(app.state.assembly.routes),
            len(app.state.assembly.partners.partners),
            "https" if settings.trust.tls is not None else "http",
            host,
            port,
            config_shown(settings),
            shown_url(settings.store_url),
        )
    _freeze_startup_objects()
    # The event loop gives up the interpreter lock at every wait for the network, and gets it back only when
    # a thread working on a large document drops it: by default after 5 ms, so a request that waits a few
    # times behind such work took tens of milliseconds. A millisecond bounds each wait to that.
    sys.setswitchinterval(SWITCH_INTERVAL)
    options = dict(
        log_level=args.log_level.lower(),
        access_log=not args.no_access_log,
        lifespan="on",
        timeout_graceful_shutdown=10,
        log_config=uvicorn_log_config(),
        **trust_options(settings, protocol_options()),
    )
    app = TrustMiddleware(
        app,
        settings.trust,  # client address and certificate from trusted proxies
        on_lifespan=lambda: start_reloading(getattr(app.state, "assembly", None)),
    )
    if args.listen_fd is None:
        uvicorn.run(app, host=host, port=port, **options)
    else:
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
    from gateway.runtime.processes import Supervisor
    from gateway.runtime.serving import open_broker

    pin = settings.pin_processes if args.pin_processes is None else args.pin_processes
    supervisor = Supervisor(settings, count, host=host, port=port, child_args=_child_args(args, settings), pin=pin)
    open_broker(settings).close()  # migrations run once, and a store that cannot open fails here
    bound = supervisor.bind()  # the port asked for, or the one the system gave for 0
    log.info(
        "serving on %s://%s:%d from %d processes%s (configuration %s, store %s)",
        "https" if settings.trust.tls is not None else "http",
        host,
        bound,
        count,
        ", each bound to one CPU" if pin else "",
        config_shown(settings),
        shown_url(settings.store_url),
    )
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

    from broker_core.collector import STOMP_YOUNG, settle_collector
    from gateway.runtime.serving import open_broker, start_stomp, stomp_options

    if args.hash_passcode:
        from gateway.runtime.stomp_listener import print_passcode_hash

        return print_passcode_hash()
    settings = settings_for(args)
    if args.port is not None or args.host is not None:
        settings.stomp = {
            **(settings.stomp or {}),
            **({"port": args.port} if args.port is not None else {}),
            **({"host": args.host} if args.host is not None else {}),
            "enabled": True,
        }
    section = settings.stomp or {}
    if section.get("enabled", True) is False:
        raise CommandError(
            f"the STOMP listener is disabled (stomp.enabled: false in {settings.config_path}); "
            "enable it there or pass --port"
        )
    _probe_listen(section.get("host", "127.0.0.1"), int(section.get("port", 61613)))
    stomp_options(settings)  # refused without users, on any address (their passcodes made on first run)
    broker = open_broker(settings)

    async def run() -> None:
        server = await start_stomp(settings, broker)
        if server is None:
            raise CommandError(
                "the STOMP listener did not start (the reason is logged above); choose a free port with --port"
            )
        settle_collector(STOMP_YOUNG)  # see broker_core.collector
        print(f"STOMP listener on {server.host}:{server.port} (store {shown_url(settings.store_url)})", flush=True)
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

    from gateway.exchange.assemble import Assembly
    from gateway.intake.schemas import SchemaRegistry
    from gateway.routing.partners import PartnerRegistry
    from gateway.routing.routes import RouteTable
    from gateway.runtime.serving import Runtime

    settings = settings_for(args)
    if not settings.workers:
        raise CommandError(
            f"{settings.config_path}: no 'workers:' are configured, so there is nothing to run; list "
            "handler modules under 'workers:' (e.g. - gateway.samples.order_responder)"
        )
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
