"""What ``b2bgw serve`` gives uvicorn for ``server.tls`` and ``server.trusted_proxies``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.trust.settings import TrustSettings

__all__ = ["trust_options"]

log = logging.getLogger(__name__)


def trust_options(settings: Any, protocol_options: dict[str, Any]) -> dict[str, Any]:
    """uvicorn ``Config`` options over *protocol_options* (``http``: the protocol class): with ``server.tls``
    every connection goes through :class:`~gateway.trust.https_only.HttpsOnlyProtocol` with the server's
    context (reloaded on file change and SIGHUP); and no proxy headers of uvicorn's own
    (:class:`gateway.trust.peer.TrustMiddleware` reads them, from trusted proxies only)."""
    trust: TrustSettings = settings.trust
    options: dict[str, Any] = {**protocol_options, "proxy_headers": False}
    if trust.tls is not None:
        from gateway.trust.https_only import https_only_factory
        from gateway.trust.tls import CertificateReloader

        reloader = CertificateReloader(trust.tls)
        reloader.install_sighup()
        options["http"] = https_only_factory(protocol_options["http"], reloader.context)
        reloaders.append(reloader)
    return options


#: The reloaders made by :func:`trust_options`; :func:`start_reloading` starts their polling.
reloaders: list[Any] = []


def start_reloading(assembly: Any = None) -> None:
    """Poll the certificate files and the partners file (of *assembly*), applying what changed on the running
    event loop's thread (call from that loop)."""
    loop = asyncio.get_running_loop()
    for reloader in reloaders:
        reloader.start(loop)
    if assembly is not None:
        from gateway.runtime.partners_watch import PartnersWatcher
        from gateway.trust.expiry import ExpiryWatch

        settings = assembly.settings
        watcher = PartnersWatcher(settings, assembly.partners, settings.trust.partners_reload)
        watcher.start(loop)
        ExpiryWatch(assembly.partners, settings.trust.expiry_warning_days).start()


def admin_listener_options(settings: Any) -> dict[str, Any]:
    """uvicorn ``Config`` options of the admin listener (``admin.port``): with ``server.tls``, HTTPS with the
    same certificate (and the same reloads) as the partner API, plain HTTP answered 400."""
    trust: TrustSettings = settings.trust
    if trust.tls is None:
        return {"proxy_headers": False}
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from gateway.trust.https_only import https_only_factory
    from gateway.trust.tls import CertificateReloader

    if not reloaders:
        reloader = CertificateReloader(trust.tls)
        reloader.install_sighup()
        reloader.start(asyncio.get_running_loop())
        reloaders.append(reloader)
    return {"proxy_headers": False, "http": https_only_factory(HttpToolsProtocol, reloaders[0].context)}
