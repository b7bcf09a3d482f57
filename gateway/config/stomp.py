"""The ``stomp:`` section: the STOMP listener, its users and their rights, its limits.

Each value is checked at its line; :mod:`gateway.runtime.stomp_listener`
turns the section into the listener's users and options. A user is::

    users:
      backend:
        passcode_hash: "scrypt$ln=14,r=8,p=1$...$..."   # or passcode_file (generated on first run)
        consume: [/queue/orders.inbound]                 # SUBSCRIBE (take messages)
        browse: [/queue/DLQ.>]                           # SUBSCRIBE browser:true
        send: [/queue/audit.>]                           # SEND, and name in reply-to
        client_ids: [backend, backend.*]                 # CONNECT client-id (default: these two)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from broker_core.stomp import DestinationPattern, StompLimits, StompUser, is_passcode_hash
from gateway.errors import clip
from gateway.marked import (
    MarkedDict,
    check_keys,
    expect_bool,
    expect_choice,
    expect_int,
    expect_list,
    expect_mapping,
    expect_str,
)
from gateway.trust.settings import parse_tls

__all__ = ["STOMP_KEYS", "USER_KEYS", "LIMIT_KEYS", "stomp_section"]

STOMP_KEYS = {
    "enabled",
    "host",
    "port",
    "users",
    "heartbeat",
    "prefetch",
    "max_frame_size",
    "selector_string_numbers",
    "limits",
    "tls",
}
USER_KEYS = {"passcode_hash", "passcode_file", "consume", "browse", "send", "client_ids"}
LIMIT_KEYS = {f.name for f in dataclasses.fields(StompLimits)}
_SECONDS = {"connect_timeout", "send_wait"}
_NO_USERS_HINT = (
    "give each back end a user: stomp.users.LOGIN.passcode_file: ../var/stomp/LOGIN.passcode (b2bgw "
    "writes a new passcode there on first run) and its rights (consume, browse, send); see "
    "docs/security.md"
)


def stomp_section(stomp: MarkedDict, base_dir: Path) -> dict[str, Any]:
    """The checked section; ``users`` entries carry ``passcode_file`` as an absolute path."""
    check_keys(stomp, STOMP_KEYS, "stomp")
    out = dict(stomp)
    if "enabled" in stomp:
        expect_bool(stomp["enabled"], stomp.at("enabled"), "stomp.enabled")
    if "host" in stomp:
        expect_str(stomp["host"], stomp.at("host"), "stomp.host")
    if "port" in stomp:
        expect_int(stomp["port"], stomp.at("port"), "stomp.port", minimum=0, maximum=65535)
    if "users" in stomp:
        users = expect_mapping(stomp["users"], stomp.at("users"), "stomp.users")
        out["users"] = {login: _user(users, login, base_dir) for login in users}
    if "heartbeat" in stomp:
        beats = expect_list(stomp["heartbeat"], stomp.at("heartbeat"), "stomp.heartbeat")
        if len(beats) != 2:
            raise stomp.at("heartbeat").error("stomp.heartbeat must be [send_ms, receive_ms], e.g. [10000, 10000]")
        for i, beat in enumerate(beats):
            expect_int(beat, beats.at(i), "a stomp.heartbeat interval (ms, 0: none)", minimum=0, maximum=3_600_000)
    if "prefetch" in stomp:
        expect_int(stomp["prefetch"], stomp.at("prefetch"), "stomp.prefetch", minimum=1)
    if "max_frame_size" in stomp:
        expect_int(stomp["max_frame_size"], stomp.at("max_frame_size"), "stomp.max_frame_size", minimum=1024)
    if "selector_string_numbers" in stomp:
        expect_choice(
            stomp["selector_string_numbers"],
            stomp.at("selector_string_numbers"),
            "stomp.selector_string_numbers",
            ("convert", "strict"),
        )
    if "limits" in stomp:
        out["limits"] = _limits(expect_mapping(stomp["limits"], stomp.at("limits"), "stomp.limits"))
    if stomp.get("tls") is not None:  # the same keys as server.tls: STOMP over TLS on stomp.port
        out["tls"] = parse_tls(expect_mapping(stomp["tls"], stomp.at("tls"), "stomp.tls"), base_dir, "stomp.tls")
    return out


def _user(users: MarkedDict, login: Any, base_dir: Path) -> dict[str, Any]:
    where = users.at(login)
    if not isinstance(login, str) or not login:
        raise where.error(
            f"stomp.users: a login must be a non-empty string (quote one that YAML reads as a number); "
            f"got {clip(repr(login), 40)}"
        )
    what = f"stomp.users.{login}"
    if isinstance(users[login], str):
        raise where.error(
            f"{what}: passcodes are not kept in the configuration any more; give the user a "
            "passcode_hash (`b2bgw stomp --hash-passcode` prints one) or a passcode_file, and its "
            "rights (consume, browse, send); see docs/security.md"
        )
    entry = expect_mapping(users[login], where, what)
    check_keys(entry, USER_KEYS, what)
    user: dict[str, Any] = {}
    if ("passcode_hash" in entry) == ("passcode_file" in entry):
        raise where.error(
            f"{what} needs one of passcode_hash (a scrypt hash, `b2bgw stomp --hash-passcode`) or "
            "passcode_file (where b2bgw writes a generated passcode on first run)"
        )
    if "passcode_hash" in entry:
        value = expect_str(entry["passcode_hash"], entry.at("passcode_hash"), f"{what}.passcode_hash")
        if not is_passcode_hash(value):
            raise entry.at("passcode_hash").error(
                f"{what}.passcode_hash must be 'scrypt$ln=..,r=..,p=..$<salt>$<hash>'"
                " as `b2bgw stomp --hash-passcode` prints it"
            )
        user["passcode_hash"] = value
    else:
        value = expect_str(entry["passcode_file"], entry.at("passcode_file"), f"{what}.passcode_file")
        user["passcode_file"] = str((base_dir / value).resolve())
    for action in ("consume", "browse", "send"):
        patterns = expect_list(entry.get(action), entry.at(action) if action in entry else where, f"{what}.{action}")
        for i, pattern in enumerate(patterns):
            text = expect_str(pattern, patterns.at(i), f"a {what}.{action} pattern")
            try:
                DestinationPattern(text)
            except ValueError as error:
                raise patterns.at(i).error(f"{what}.{action}: {error}") from None
        user[action] = list(patterns)
    if "client_ids" in entry:
        ids = expect_list(entry["client_ids"], entry.at("client_ids"), f"{what}.client_ids")
        for i, pattern in enumerate(ids):
            expect_str(pattern, ids.at(i), f"a {what}.client_ids pattern")
        user["client_ids"] = list(ids)
    try:  # the patterns of client ids, and anything else StompUser refuses
        StompUser(
            login,
            "scrypt$ln=1,r=1,p=1$AAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAA",
            consume=user["consume"],
            browse=user["browse"],
            send=user["send"],
            client_ids=user.get("client_ids"),
        )
    except ValueError as error:
        raise where.error(f"{what}: {error}") from None
    return user


def _limits(limits: MarkedDict) -> dict[str, Any]:
    check_keys(limits, LIMIT_KEYS, "stomp.limits")
    out: dict[str, Any] = {}
    for key, value in limits.items():
        where = limits.at(key)
        if key in _SECONDS:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise where.error(
                    f"stomp.limits.{key} must be a positive number of seconds; got {clip(repr(value), 40)}"
                )
            out[key] = float(value)
        else:
            out[key] = expect_int(
                value, where, f"stomp.limits.{key}", minimum=256 if key == "connect_frame_bytes" else 1
            )
    return out


def no_users_hint() -> str:
    return _NO_USERS_HINT
