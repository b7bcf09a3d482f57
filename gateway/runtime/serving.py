"""What runs while the gateway serves: the broker on its store, the ledger,
the :class:`~gateway.exchange.submission.Gateway`, the status reconciler, the in-process
handler workers, the nightly warehouse load and the ledger's archive job
(``ledger.retention``).

:class:`Runtime` starts them in that order and stops them in reverse; the
HTTP app (:mod:`gateway.http.app`) runs one in its lifespan, ``b2bgw worker`` runs
one with the workers only.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
from typing import Any

from broker_core import Broker
from gateway.config.loader import Settings
from gateway.delivery.running import start_delivery, upgrade_deliveries
from gateway.errors import ConfigError
from gateway.exchange.assemble import Assembly
from gateway.exchange.submission import Gateway
from gateway.ledger.reconciler import Reconciler
from gateway.ledger.records import Ledger, current_revision, head_revision, upgrade_ledger
from gateway.routing.partners import PartnerRegistry
from gateway.runtime.stomp_listener import stomp_options  # the listener's options: its users, limits

__all__ = ["Runtime", "etl_enabled", "open_broker", "start_stomp", "start_workers", "stomp_options"]

log = logging.getLogger(__name__)


def open_broker(settings: Settings, **overrides: Any) -> Broker:
    """Open the broker on the configured store and make sure the ledger tables are current.

    SQLite: both migrations run here. PostgreSQL: the broker refuses a schema
    that is behind, and so does this for the ledger: run ``b2bgw db upgrade``.
    """
    if not settings.is_sql_store:
        raise ConfigError(
            f"store.url {settings.store_url!r}: the gateway keeps its ledger in a SQL store; use "
            "sqlite:///PATH or postgresql+psycopg://USER@HOST/DB",
            file=settings.where.file,
        )
    options = {**settings.store_options, **overrides}
    broker = Broker.open(settings.store_url, **options)
    try:
        engine = broker.engine
        if engine.dialect.name == "sqlite":
            upgrade_ledger(engine)
            upgrade_deliveries(engine)
        else:
            current, head = current_revision(engine), head_revision()
            if current != head:
                raise ConfigError(
                    f"the ledger tables are at revision {current or 'none'}, the gateway needs {head}: run "
                    "`b2bgw db upgrade` first"
                )
    except BaseException:
        broker.close()
        raise
    return broker


def etl_enabled(settings: Settings) -> bool:
    """``etl.enabled`` if set, else whether pyspark is installed."""
    enabled = settings.etl.get("enabled")
    if enabled is None:
        return importlib.util.find_spec("pyspark") is not None
    return bool(enabled)


def start_workers(settings: Settings, broker: Broker) -> Any:
    """Import the configured handler modules and start a Worker on *broker*; None when none are configured.

    A ``concurrency`` given in the configuration replaces the one the module's handlers declare."""
    if not settings.workers:
        return None
    for module in settings.workers:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise settings.workers_where.error(f"worker module {module!r} cannot be imported: {exc}") from None
    try:
        handlers = importlib.import_module("gateway.handlers")
    except ImportError as exc:
        raise settings.workers_where.error(
            f"the handler framework (gateway.handlers) is not available: {exc}"
        ) from None
    items = []
    for item in handlers.registry:
        module = getattr(item.function, "__module__", None)
        concurrency = settings.worker_concurrency.get(module)
        if concurrency is not None and not item.destination.is_topic:
            item = dataclasses.replace(item, concurrency=concurrency)
        items.append(item)
    worker = handlers.Worker(broker, items, partners=PartnerRegistry.from_settings(settings))
    worker.start()
    return worker


async def start_stomp(settings: Settings, broker: Broker) -> Any:
    """Start the STOMP listener on the running loop; ``None`` if disabled or
    its port is taken (logged: the HTTP gateway still serves)."""
    options = stomp_options(settings)
    if options is None:
        return None
    import asyncio

    from gateway.runtime.stomp_listener import StompListener

    reloader = None
    tls = (settings.stomp or {}).get("tls")
    if tls is not None:  # stomp.tls: the certificate reloaded on file change and SIGHUP, as server.tls's
        from gateway.trust.tls import CertificateReloader

        reloader = CertificateReloader(tls, alpn=())
        options["ssl"] = reloader.context
    server = StompListener(broker, **options)
    server.reloader = reloader
    try:
        await server.start()
        if reloader is not None:
            reloader.install_sighup()
            reloader.start(asyncio.get_running_loop())
    except OSError as exc:
        log.error(
            "STOMP listener not started on %s:%s: %s (set stomp.port, or stomp.enabled: false)",
            options["host"],
            options["port"],
            exc,
        )
        return None
    return server


class Runtime:
    """The running parts of a gateway (see the module docstring)."""

    def __init__(
        self,
        assembly: Assembly,
        *,
        broker: Broker | None = None,
        workers: bool = True,
        etl: bool = True,
        reconcile: bool = True,
        gateway: bool = True,
    ) -> None:
        self.assembly = assembly
        self.settings = assembly.settings
        self.broker = broker
        self._own_broker = broker is None
        self.gateway: Gateway | None = None
        self.reconciler: Reconciler | None = None
        self.worker: Any = None
        self.delivery: Any = None
        self.etl: Any = None
        self.archive: Any = None
        self._want_workers = workers
        self._want_etl = etl
        self._want_reconcile = reconcile
        self._want_gateway = gateway
        self.started = False

    def start(self) -> None:
        """Start everything (blocking; call it from a thread under asyncio)."""
        try:
            if self.broker is None:
                self.broker = open_broker(self.settings)
            if self._want_gateway:
                self.gateway = Gateway(
                    self.assembly,
                    self.broker,
                    intake_threads=self.settings.intake_threads,
                    intake_facts=self.settings.intake_facts,
                    large_workers=self.settings.intake_workers,
                )
                self.gateway.start()
            if self._want_reconcile:
                self.reconciler = Reconciler(
                    self.broker, Ledger(self.broker.engine), interval=self.settings.reconcile_interval
                )
                self.reconciler.start()
            if self._want_workers:
                self.worker = start_workers(self.settings, self.broker)
            if self._want_gateway:
                self.delivery = start_delivery(self.assembly.partners, self.broker)
            if self._want_etl and etl_enabled(self.settings):
                self.etl = self._start_etl()
            if self._want_etl and self.settings.retention is not None and self.settings.retention.enabled:
                self.archive = self._start_archive()
            self.started = True
        except BaseException:
            self.stop()
            raise

    def _start_etl(self) -> Any:
        try:
            from spark_etl.scheduler import NightlyLoad  # type: ignore[import-not-found]
        except ImportError as exc:
            if self.settings.etl.get("enabled") is True:
                raise ConfigError(
                    f"etl.enabled is true but the warehouse load is not available: {exc}", file=self.settings.where.file
                ) from None
            log.info("nightly warehouse load not started: %s", exc)
            return None
        load = NightlyLoad(dict(self.settings.etl), self.settings.store_url)
        load.start()
        log.info("nightly warehouse load scheduled")
        return load

    def _start_archive(self) -> Any:
        """The ledger's archive job on its schedule (spark_etl.archive), sharing this process's store."""
        policy = self.settings.retention
        if policy.needs_archive and importlib.util.find_spec("pyarrow") is None:
            raise ConfigError(
                "ledger.retention archives documents (after: archive), which needs pyarrow: install "
                "the etl extra (pip install 'b2bgw[etl]'), or set after: purge",
                file=self.settings.where.file,
            )
        from spark_etl.archive import ArchiveSchedule, archive_root, store_writer

        assert self.broker is not None
        schedule = ArchiveSchedule(
            policy,
            self.settings.store_url,
            engine=self.broker.engine,
            write=store_writer(self.broker),
            purge_write=store_writer(self.broker, durable=False),
            root=archive_root(policy, self.settings.etl),
            wait_for_warehouse=etl_enabled(self.settings),
        )
        schedule.start()
        return schedule

    def stop(self) -> None:
        """Stop everything that started, in reverse order."""
        if self.archive is not None:
            try:
                self.archive.stop()
            except Exception:  # keep stopping the rest
                log.exception("stopping the ledger archive failed")
            self.archive = None
        if self.etl is not None:
            try:
                self.etl.stop()
            except Exception:  # keep stopping the rest
                log.exception("stopping the warehouse load failed")
            self.etl = None
        if self.delivery is not None:
            self.delivery.stop()
            self.delivery = None
        if self.worker is not None:
            try:
                self.worker.stop()
            except Exception:
                log.exception("stopping the workers failed")
            self.worker = None
        if self.reconciler is not None:
            self.reconciler.stop()
            self.reconciler = None
        if self.gateway is not None:
            self.gateway.stop()
        if self.broker is not None and self._own_broker:
            self.broker.close()
        self.started = False
