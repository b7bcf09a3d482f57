"""Partners and keys that change while serving: the partners file watched and re-read.

Each serving process polls the file that declares the partners (``partners: partners.yaml``, or the main
configuration file when they are inline) every ``server.partners_reload`` seconds (default 1). When it
changed, the whole configuration is parsed again off the event loop, exactly as at start-up, and the new
partner registry replaces the old one in one step on the event loop: a request is authenticated against
the old registry or the new one, never against a mixture. Remembered key checks go with the old registry,
so a revoked key fails on its next request. A file that does not parse is logged and the old registry
kept until a good one is written. Every process does this on its own, so a change reaches all of them
within the polling interval (plus the time to parse); the file is the declaration, kept in version control
or written by the deployment's own tooling.

Changes made from the admin side (partners added, keys issued and revoked, pins added and removed:
:mod:`gateway.routing.overlay`) are rows in the store; at the same interval the watcher reads their version
(the greatest row number, one index look-up) and, when it grew or the file changed, serves the file's
registry with the rows folded over it, swapped in the same way.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import Any

__all__ = ["PartnersWatcher", "partners_file"]

log = logging.getLogger(__name__)


def partners_file(settings: Any) -> Path | None:
    """The file that declares *settings*' partners, or None (a configuration built in memory)."""
    source = getattr(settings, "source", None)
    if isinstance(source, dict) and isinstance(source.get("partners"), str):
        return (Path(settings.base_dir) / source["partners"]).resolve()
    return Path(settings.config_path).resolve() if settings.config_path is not None else None


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class PartnersWatcher:
    """Polls the partners file of *settings* and swaps *registry*'s content when it changes."""

    def __init__(self, settings: Any, registry: Any, interval: float = 1.0) -> None:
        self.settings = settings
        self.registry = registry
        self.interval = interval
        self.path = partners_file(settings)
        self._stamp = _stamp(self.path) if self.path is not None else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._store_down = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._thread is not None or self.interval <= 0:
            return
        self._loop = loop
        self._thread = threading.Thread(target=self._poll, name="b2bgw-partners-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # the watcher must outlive any one failure
                log.exception("checking the partners file failed")

    def _declared(self) -> Any:
        """The file's registry when the file changed since the last look (None: unchanged, or not readable)."""
        if self.path is None or self.settings.config_path is None:
            return None
        stamp = _stamp(self.path)
        if stamp is None or stamp == self._stamp:
            return None
        self._stamp = stamp
        from gateway.config.loader import load_settings
        from gateway.errors import ConfigError
        from gateway.routing.partners import PartnerRegistry

        try:
            return PartnerRegistry.from_settings(load_settings(self.settings.config_path))
        except ConfigError as exc:
            log.error("partners not reloaded, the previous ones still apply: %s", exc)
            return None

    def check(self) -> bool:
        """Re-read the file if it changed, the store's partner changes if they did; whether a new registry was
        scheduled."""
        declared = self._declared()
        overlay = getattr(self.registry, "overlay", None)
        if overlay is not None:
            if declared is not None:
                overlay.declared = declared
            try:
                if declared is None and overlay.current_version() == overlay.version:
                    self._store_down = False
                    return False
                fresh = overlay.rebuild()
            except Exception as exc:  # the store is away: the partners served stay, said once per outage
                if not self._store_down:
                    log.warning("the store's partner changes could not be read, the current partners stay: %s", exc)
                self._store_down = True
                self._stamp = None if declared is not None else self._stamp  # the file is read again next time
                return False
            self._store_down = False
        elif declared is None:
            return False
        else:
            fresh = declared
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.apply, fresh)
        else:
            self.apply(fresh)
        return True

    def apply(self, fresh: Any) -> None:
        """Make the live registry *fresh*'s content (on the event loop: between two requests' checks)."""
        old_keys, old_partners = set(self.registry.keys), set(self.registry.partners)
        self.registry.adopt(fresh)
        new_keys, new_partners = set(self.registry.keys), set(self.registry.partners)
        log.warning(
            "partners reloaded from %s and the store's partner changes: %d partners, %d keys (partners added %s, removed %s; keys added "
            "%s, removed %s)",
            self.path,
            len(new_partners),
            len(new_keys),
            sorted(new_partners - old_partners) or "none",
            sorted(old_partners - new_partners) or "none",
            sorted(new_keys - old_keys) or "none",
            sorted(old_keys - new_keys) or "none",
        )
