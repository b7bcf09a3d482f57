"""What ``b2bgw serve`` gives uvicorn for ``server.tls`` and ``server.trusted_proxies``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.trust.settings import TrustSettings

__all__ = ["trust_options"]

log = logging.getLogger("gateway.trust.serving")


def trust_options(settings: Any) -> dict[str, Any]:
    """uvicorn ``Config`` options: the TLS context (reloaded on file change and SIGHUP), and no proxy headers
    of uvicorn's own (:class:`gateway.trust.peer.TrustMiddleware` reads them, from trusted proxies only)."""
    trust: TrustSettings = settings.trust
    options: dict[str, Any] = {"proxy_headers": False}
    if trust.tls is not None:
        from gateway.trust.tls import CertificateReloader

        def factory(config: Any, default: Any) -> Any:
            reloader = CertificateReloader(trust.tls)  # type: ignore[arg-type]
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            reloader.start(loop)
            reloader.install_sighup()
            return reloader.context

        options["ssl_context_factory"] = factory
    return options
