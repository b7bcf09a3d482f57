"""STOMP users and their rights on destinations.

A :class:`StompUser` has a login, the hash of its passcode and, per action,
the destinations it may use, as patterns of STOMP destinations with
ActiveMQ's wildcards: the name is split at dots, ``*`` stands for one
segment and a final ``>`` for one or more (``/queue/orders.*``,
``/topic/prices.>``, ``/queue/>`` for every queue). The actions:

* ``consume``: SUBSCRIBE to a queue (taking its messages) or to a topic
  (durable or not);
* ``browse``: SUBSCRIBE with ``browser:true`` (reading a queue without
  taking anything; dead-letter queues are ``/queue/DLQ.<queue>``);
* ``send``: SEND to a queue or a topic, and name it in ``reply-to``.

Nothing is allowed unless a pattern allows it. Temporary destinations are
not named by patterns (see ``_connection``): a connection uses its own, and
SENDs to another's only to reply to a message it consumed.

``client_ids``: the ``client-id`` values the user may claim in CONNECT
(same wildcards, without the ``/queue/`` prefix); by default its login and
``LOGIN.*`` names, so that no user can take another's durable subscriptions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ._passcodes import is_passcode_hash

__all__ = ["StompUser", "DestinationPattern", "ACTIONS", "ALL_DESTINATIONS"]

ACTIONS = ("consume", "browse", "send")
#: every queue and every topic
ALL_DESTINATIONS = ("/queue/>", "/topic/>")
_CACHE_SIZE = 4096


def _name_regex(name: str, what: str) -> str:
    segments = name.split(".")
    parts = []
    for i, segment in enumerate(segments):
        if segment == ">":
            if i != len(segments) - 1:
                raise ValueError(f"{what}: '>' may only be the last segment")
            parts.append(r"[^.]+(?:\.[^.]+)*")
        elif segment == "*":
            parts.append(r"[^.]+")
        elif not segment or "*" in segment or ">" in segment:
            raise ValueError(
                f"{what}: empty segment, or a wildcard inside a segment ('*' and '>' stand for "
                "whole dot-separated segments)"
            )
        else:
            parts.append(re.escape(segment))
    return r"\.".join(parts)


class DestinationPattern:
    """``/queue/NAME`` or ``/topic/NAME`` with ``*`` and ``>`` segments."""

    __slots__ = ("text", "kind", "regex")

    def __init__(self, text: str) -> None:
        for prefix in ("/queue/", "/topic/"):
            if text.startswith(prefix):
                self.kind = prefix.strip("/")
                name = text[len(prefix) :]
                break
        else:
            raise ValueError(
                f"destination pattern {text!r} must start with /queue/ or /topic/ "
                "(temporary destinations need no rights)"
            )
        if not name:
            raise ValueError(f"destination pattern {text!r} names nothing: use {text}> for all of them")
        self.text = text
        self.regex = re.compile(_name_regex(name, f"destination pattern {text!r}"))

    def matches(self, kind: str, name: str) -> bool:
        return kind == self.kind and self.regex.fullmatch(name) is not None

    def __repr__(self) -> str:
        return f"DestinationPattern({self.text!r})"


class StompUser:
    """A login allowed to CONNECT, with its rights (see the module docstring).

    ``passcode_hash``: as :func:`~broker_core.stomp.hash_passcode` makes it.
    ``consume``, ``browse``, ``send``: destination patterns (default: none).
    ``client_ids``: patterns of client ids (default: the login and
    ``LOGIN.*``).
    """

    def __init__(
        self,
        login: str,
        passcode_hash: str,
        *,
        consume: Iterable[str] = (),
        browse: Iterable[str] = (),
        send: Iterable[str] = (),
        client_ids: Iterable[str] | None = None,
    ) -> None:
        if not login or not isinstance(login, str):
            raise ValueError("a STOMP user needs a non-empty login")
        if not is_passcode_hash(passcode_hash):
            raise ValueError(
                f"STOMP user {login!r}: passcode_hash must be 'scrypt$ln=..,r=..,p=..$<salt>$<hash>' "
                "as broker_core.stomp.hash_passcode makes it"
            )
        self.login = login
        self.passcode_hash = passcode_hash
        self.rights = {
            "consume": tuple(DestinationPattern(p) for p in consume),
            "browse": tuple(DestinationPattern(p) for p in browse),
            "send": tuple(DestinationPattern(p) for p in send),
        }
        ids = [login, login + ".*"] if client_ids is None else list(client_ids)
        self.client_ids = tuple(re.compile(_name_regex(p, f"client id pattern {p!r}")) for p in ids)
        self._cache: dict[tuple[str, str, str], bool] = {}

    @classmethod
    def with_all_rights(cls, login: str, passcode_hash: str) -> StompUser:
        """A user that may consume, browse and send everywhere (a trusted back end, tests)."""
        return cls(
            login,
            passcode_hash,
            consume=ALL_DESTINATIONS,
            browse=ALL_DESTINATIONS,
            send=ALL_DESTINATIONS,
            client_ids=(">",),
        )

    def may(self, action: str, kind: str, name: str) -> bool:
        """Whether this user may *action* (consume, browse, send) the ``kind`` (queue, topic) *name*."""
        key = (action, kind, name)
        allowed = self._cache.get(key)
        if allowed is None:
            allowed = any(p.matches(kind, name) for p in self.rights[action])
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.clear()
            self._cache[key] = allowed
        return allowed

    def may_claim(self, client_id: str) -> bool:
        return any(p.fullmatch(client_id) for p in self.client_ids)

    def __repr__(self) -> str:
        return f"StompUser({self.login!r})"
