"""The options :meth:`Broker.open` takes, each with one rule.

A wrong name or value raises :class:`InvalidArgumentError` naming the option,
what it must be and what it got, before anything is opened: an operator who
writes ``prefetch: abc`` or ``local_wakeups: "no"`` in a configuration file is
told so at start-up (``b2bgw routes check`` tells it before), instead of a
``ValueError`` from deep inside the store or, worse, a value taken for another
(``bool("no")`` is true).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ._errors import InvalidArgumentError

__all__ = ["check_options", "check_store_options", "store_kind"]


@dataclass(frozen=True, slots=True)
class _Rule:
    kind: str  # "int", "seconds" or "number" (real), "bool", "name" (a non-empty string), "choice", "namespaces"
    minimum: float | None = None
    maximum: float | None = None
    above_minimum: bool = False  # the minimum itself is not allowed
    choices: tuple[str, ...] = ()
    optional: bool = False  # None is allowed
    hint: str = ""  # what a special value means, for the message

    def describe(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.kind == "name":
            return "a non-empty string" + (" or null" if self.optional else "")
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "namespaces":
            return "a mapping of prefixes to namespace URIs"
        what, unit = {
            "int": ("a whole number", ""),
            "seconds": ("a number of seconds", " s"),
            "number": ("a number", ""),
        }[self.kind]
        if self.minimum is not None and self.maximum is not None:
            return f"{what} from {self.minimum:g} to {self.maximum:g}{unit}"
        if self.minimum is not None:
            return f"{what} {'over' if self.above_minimum else 'of at least'} {self.minimum:g}{unit}"
        return what

    def check(self, name: str, value: Any) -> Any:
        if value is None and self.optional:
            return None
        if self.kind == "bool":
            ok = isinstance(value, bool)
        elif self.kind == "name":
            ok = isinstance(value, str) and value != ""
        elif self.kind == "choice":
            ok = isinstance(value, str) and value.upper() in self.choices
            value = value.upper() if ok else value
        elif self.kind == "namespaces":
            ok = isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        else:  # a number; bool is an int to Python, never to a reader of the configuration
            number = isinstance(value, int) if self.kind == "int" else isinstance(value, (int, float))
            number = number and not isinstance(value, bool)
            ok = (
                number
                and math.isfinite(value)
                and (self.minimum is None or value > self.minimum or (value == self.minimum and not self.above_minimum))
                and (self.maximum is None or value <= self.maximum)
            )
        if not ok:
            shown = repr(value)
            raise InvalidArgumentError(
                f"option {name} must be {self.describe()}{self.hint}, not "
                f"{shown if len(shown) <= 80 else shown[:77] + '...'}",
                option=name,
            )
        return value


_SECONDS = _Rule("seconds", minimum=0)
_POSITIVE_SECONDS = _Rule("seconds", minimum=0, above_minimum=True)

#: The broker's own options and its redelivery policy's (RedeliveryPolicy): the same for every store.
BROKER_OPTIONS: dict[str, _Rule] = {
    "xpath_namespaces": _Rule("namespaces", optional=True),
    "sweep_interval": _Rule("seconds", minimum=0, hint=" (0: never sweep)"),
    "max_deliveries": _Rule("int", minimum=1),
    "redelivery_delay": _Rule("seconds", minimum=0, hint=" (0: at once)"),
    "redelivery_backoff": _Rule("number", minimum=1),
    "max_redelivery_delay": _SECONDS,
    "dead_letter_prefix": _Rule("name"),
    "expiry_queue": _Rule("name", optional=True),
    "selector_string_numbers": _Rule("choice", choices=("STRICT", "CONVERT")),
}

#: The SQL store's options (documented on SQLStore).
SQL_STORE_OPTIONS: dict[str, _Rule] = {
    "sqlite_synchronous": _Rule("choice", choices=("FULL", "EXTRA", "NORMAL")),
    "prefetch": _Rule("int", minimum=1),
    "heartbeat_interval": _POSITIVE_SECONDS,
    "lease_timeout": _POSITIVE_SECONDS,
    "retry_for": _SECONDS,
    "auto_upgrade": _Rule("bool"),
    "poll_interval": _POSITIVE_SECONDS,
    "local_wakeups": _Rule("bool"),
    "pool_size": _Rule("int", minimum=1),
    "expired_retention": _SECONDS,
    "commit_delay": _Rule("seconds", minimum=0, maximum=0.1, hint=" (0 turns it off)"),
    "compress_over": _Rule("int", minimum=0, hint=" (bytes; 0 turns compression off)"),
    "slow_commit_warning": _Rule("seconds", minimum=0, hint=" (0 turns the warning off)"),
}


def store_kind(url: str) -> str:
    """``"memory"`` or ``"sql"``: the store a broker URL names (else InvalidArgumentError)."""
    if url.startswith("memory:"):
        return "memory"
    if url.startswith(("sqlite:", "postgresql")):
        return "sql"
    raise InvalidArgumentError(
        f"unknown broker URL {url!r}: use memory://, sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
    )


def _store_rules(url: str) -> tuple[str, dict[str, _Rule]]:
    return ("the SQL store", SQL_STORE_OPTIONS) if store_kind(url) == "sql" else ("the memory store", {})


def check_store_options(url: str, options: Mapping[str, Any], *, also: Iterable[str] = ()) -> dict[str, Any]:
    """The store's options for *url*, checked (names and values; choices upper-cased). *also*: the
    other names the caller knows, for the message about an unknown one."""
    store, rules = _store_rules(url)
    unknown = sorted(set(options) - set(rules))
    if unknown:
        known = sorted({*rules, *also})
        raise InvalidArgumentError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for "
            f"{store}: {'the options are ' + ', '.join(known) if known else 'it takes none'}",
            option=unknown[0],
        )
    return {name: rules[name].check(name, value) for name, value in options.items()}


def check_options(url: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Every :meth:`Broker.open` option for *url*, checked without opening anything."""
    broker = {name: rule.check(name, options[name]) for name, rule in BROKER_OPTIONS.items() if name in options}
    store = check_store_options(url, {k: v for k, v in options.items() if k not in BROKER_OPTIONS}, also=BROKER_OPTIONS)
    return {**broker, **store}
