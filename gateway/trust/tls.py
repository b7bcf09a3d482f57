"""The server's TLS context (``server.tls``), and its certificate reloaded without a restart.

TLS 1.2 at least (1.3 offered and preferred: OpenSSL picks the highest both sides speak), the TLS 1.2
suites limited to forward-secret AEAD ones, no compression, no renegotiation, the server's order of
preference. With ``client_ca`` the server asks for a client certificate (``CERT_OPTIONAL``): a client
without one still connects (a partner authenticated by API key), one whose certificate does not chain to
the bundle, or has expired, fails the handshake.

Reloading loads the new chain and key into the *same* context (``load_cert_chain`` again): connections
already open keep their session, every new handshake uses the new certificate. A new pair is first loaded
into a scratch context, so a half-written or mismatched file never replaces a working certificate: it is
logged, and the old one is served until a good pair appears.
"""

from __future__ import annotations

import logging
import os
import signal
import ssl
import threading
from typing import Any

from gateway.errors import ConfigError

__all__ = ["CertificateReloader", "TlsConfigError", "build_context"]

log = logging.getLogger(__name__)


class TlsConfigError(ConfigError):
    """Raised when the certificate chain, its key or the client CA bundle of ``server.tls`` cannot be loaded."""


def _load_chain(ctx: ssl.SSLContext, tls: Any) -> None:
    try:
        ctx.load_cert_chain(str(tls.certificate), str(tls.key), password=tls.key_password)
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"the certificate {tls.certificate} and key {tls.key} do not load together "
            f"({exc.reason or exc}); give the PEM chain (server certificate first) and its own "
            "private key"
        ) from None
    except OSError as exc:
        raise TlsConfigError(f"cannot read {exc.filename or tls.certificate}: {exc.strerror or exc}") from None


def build_context(tls: Any, alpn: tuple[str, ...] = ("http/1.1",)) -> ssl.SSLContext:
    """A server context for *tls* offering the *alpn* protocols; TlsConfigError if its files do not load."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if tls.min_version == "1.3" else ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_RENEGOTIATION
    try:
        ctx.set_ciphers(tls.ciphers)
    except ssl.SSLError:
        raise TlsConfigError(f"the ciphers {tls.ciphers!r} name no cipher suite OpenSSL offers") from None
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    _load_chain(ctx, tls)
    if tls.client_ca is not None:
        try:
            ctx.load_verify_locations(cafile=str(tls.client_ca))
        except (ssl.SSLError, OSError) as exc:
            raise TlsConfigError(
                f"the client CA bundle {tls.client_ca} does not load ({exc}); give PEM certificates"
            ) from None
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def _stamp(tls: Any) -> tuple[Any, ...]:
    out = []
    for path in (tls.certificate, tls.key):
        try:
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


class CertificateReloader:
    """Keeps one context's certificate in step with its files: polled every ``reload_interval`` seconds,
    and at once on ``SIGHUP`` (:meth:`install_sighup`)."""

    def __init__(self, tls: Any, context: ssl.SSLContext | None = None, alpn: tuple[str, ...] = ("http/1.1",)) -> None:
        self.tls = tls
        self.context = context or build_context(tls, alpn)
        self._stamp = _stamp(tls)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: Any = None
        #: certificate reloads that failed (the file did not load)
        self.failures = 0

    def reload(self, *, force: bool = False) -> bool:
        """Load the files again if they changed (or *force*); whether the served certificate changed."""
        with self._lock:
            stamp = _stamp(self.tls)
            if not force and stamp == self._stamp:
                return False
            try:
                _load_chain(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), self.tls)  # a bad pair stops here
                _load_chain(self.context, self.tls)
            except TlsConfigError as exc:
                if stamp != self._stamp or force:
                    self.failures += 1
                    log.error("TLS certificate not reloaded, the previous one is still served: %s", exc)
                self._stamp = stamp
                return False
            self._stamp = stamp
            log.info("TLS certificate reloaded from %s", self.tls.certificate)
            return True

    def start(self, loop: Any = None) -> None:
        """Poll the files in a daemon thread (unless ``reload_interval`` is 0). With *loop* (the event loop
        whose connections use the context) the new files are loaded on that loop's thread: OpenSSL does not
        allow changing a context while another thread makes a connection from it."""
        self._loop = loop
        if self.tls.reload_interval <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._poll, name="b2bgw-tls-reload", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.tls.reload_interval):
            try:
                if _stamp(self.tls) == self._stamp:
                    continue
                loop = self._loop
                if loop is not None and not loop.is_closed():
                    loop.call_soon_threadsafe(self.reload)
                else:
                    self.reload()
            except Exception:  # the poller must outlive any one failure
                log.exception("TLS certificate check failed")

    def stop(self) -> None:
        self._stop.set()

    def install_sighup(self) -> None:
        """Reload on SIGHUP. Python runs the handler on the main thread (the event loop's, when serving),
        between two bytecodes: never in the middle of a handshake."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGHUP)

        def on_hup(signum: int, frame: Any) -> None:
            self.reload(force=True)
            if callable(previous) and previous not in (signal.SIG_IGN, signal.SIG_DFL):
                previous(signum, frame)

        signal.signal(signal.SIGHUP, on_hup)
