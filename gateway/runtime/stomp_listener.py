"""The STOMP listener's options from the checked ``stomp:`` section
(:mod:`gateway.config.stomp`): its users, with the passcodes generated on
first run, and its limits.

A user given ``passcode_file: PATH`` gets a passcode generated once: b2bgw
writes it to PATH (mode 0600, for the operator to hand to the back end) and
its scrypt hash to ``PATH.hash``; the listener only ever reads the hash. A
PATH written by the operator is hashed the same way. Deleting PATH once the
back end has it is safe; deleting both files makes a new passcode at the
next start.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from broker_core.stomp import StompLimits, StompServer, StompUser, generate_passcode, hash_passcode, is_passcode_hash
from gateway.config.loader import STOMP_KEYS, Settings
from gateway.config.stomp import no_users_hint
from gateway.errors import ConfigError

__all__ = [
    "StompListener",
    "stomp_options",
    "listener_users",
    "passcode_hash_from_file",
    "print_passcode_hash",
    "NO_USERS",
]

log = logging.getLogger(__name__)

NO_USERS = "the STOMP listener needs stomp.users: without them it would accept any login"


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text + "\n")


def passcode_hash_from_file(path: Path, login: str) -> str:
    """The hash of the passcode kept at *path* (see the module docstring), made on first use."""
    hash_path = Path(str(path) + ".hash")
    try:
        if hash_path.exists():
            encoded = hash_path.read_text(encoding="utf-8").strip()
            if not is_passcode_hash(encoded):
                raise ConfigError(
                    f"{hash_path} does not hold a passcode hash; delete it (and {path}) to have a new "
                    f"passcode generated for STOMP user {login!r}"
                )
            return encoded
        if path.exists():
            passcode = path.read_text(encoding="utf-8").strip()
            if not passcode:
                raise ConfigError(
                    f"{path} is empty: write STOMP user {login!r}'s passcode in it, or delete it to have one generated"
                )
        else:
            passcode = generate_passcode()
            _write_private(path, passcode)
            log.warning(
                "STOMP user %r: a new passcode was written to %s (readable by this account only); give it "
                "to the back end",
                login,
                path,
            )
        encoded = hash_passcode(passcode)
        _write_private(hash_path, encoded)
        return encoded
    except OSError as exc:
        raise ConfigError(
            f"STOMP user {login!r}: cannot keep its passcode in {path}: {exc.strerror or exc}; make "
            "the folder writable by the gateway or give a passcode_hash instead"
        ) from None


def listener_users(section: dict[str, Any]) -> list[StompUser]:
    """The checked section's users as the listener takes them."""
    users = []
    for login, entry in dict(section.get("users") or {}).items():
        if "passcode_hash" in entry:
            encoded = entry["passcode_hash"]
        else:
            encoded = passcode_hash_from_file(Path(entry["passcode_file"]), login)
        users.append(
            StompUser(
                login,
                encoded,
                consume=entry.get("consume", ()),
                browse=entry.get("browse", ()),
                send=entry.get("send", ()),
                client_ids=entry.get("client_ids"),
            )
        )
    return users


class StompListener(StompServer):
    """The gateway's STOMP listener: a :class:`~broker_core.stomp.StompServer` that, over TLS
    (``stomp.tls``), stops reloading its certificate when it stops."""

    reloader: Any = None

    async def stop(self) -> None:
        if self.reloader is not None:
            self.reloader.stop()
        await super().stop()


def stomp_options(settings: Settings) -> dict[str, Any] | None:
    """``StompServer`` keyword arguments, or ``None`` when the listener is
    disabled (``enabled: false``). ConfigError without users."""
    section = dict(settings.stomp or {})
    if section.pop("enabled", True) is False:
        return None
    options: dict[str, Any] = {"host": section.pop("host", "127.0.0.1"), "port": int(section.pop("port", 61613))}
    users = listener_users({"users": section.pop("users", None)})
    if not users:
        raise ConfigError(f"{NO_USERS}; {no_users_hint()} (or stomp.enabled: false)", file=settings.where.file)
    options["users"] = users
    if "heartbeat" in section:
        send, receive = section.pop("heartbeat")
        options["heartbeat"] = (int(send), int(receive))
    for key in ("prefetch", "max_frame_size"):
        if key in section:
            options[key] = int(section.pop(key))
    if "selector_string_numbers" in section:
        options["selector_string_numbers"] = str(section.pop("selector_string_numbers"))
    options["limits"] = StompLimits(**dict(section.pop("limits", None) or {}))
    section.pop("tls", None)  # the context is made where the listener starts (start_stomp): it is reloaded there
    if section:
        raise ConfigError(
            f"unknown keys in the stomp section: {sorted(section)} (known: {', '.join(sorted(STOMP_KEYS))})",
            file=settings.where.file,
        )
    return options


def print_passcode_hash() -> int:
    """``b2bgw stomp --hash-passcode``: the hash of the passcode read on standard input."""
    import getpass
    import sys

    if sys.stdin.isatty():
        passcode = getpass.getpass("STOMP passcode: ")
    else:
        passcode = sys.stdin.readline().rstrip("\r\n")
    if not passcode:
        print(
            'no passcode given: type one, or pipe it in (printf %s "$PASSCODE" | b2bgw stomp --hash-passcode)',
            file=sys.stderr,
        )
        return 2
    print(hash_passcode(passcode))
    return 0
