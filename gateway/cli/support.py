"""What the ``b2bgw`` commands share: the user error they raise, the configuration they load, and the
argument types they parse."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from gateway.config.loader import Settings, load_settings

__all__ = [
    "CommandError",
    "existing_store_engine",
    "settings_for",
    "to_stderr",
    "shown_url",
    "one_line",
    "config_shown",
    "int_at_least",
    "port_number",
    "positive_seconds",
]


class CommandError(Exception):
    """Raised by a command for a user error it found (a bad argument, a file
    that cannot be read, an unknown partner or queue...): ``main`` prints the
    message, which says what is wrong and what to do, on one line and exits 2."""


def settings_for(args: argparse.Namespace) -> Settings:
    path = getattr(args, "config", None)
    if path is not None and not Path(path).exists():
        raise CommandError(f"-c {path}: no such file; give the path of the gateway's YAML configuration")
    env = os.environ.get("B2BGW_CONFIG")
    if path is None and env and not Path(env).exists():
        raise CommandError(
            f"$B2BGW_CONFIG={env}: no such file; point it at the gateway's YAML configuration or unset it"
        )
    return load_settings(path)


def to_stderr(text: str) -> None:
    print(text, file=sys.stderr)


def shown_url(url: str) -> str:
    """*url* with any password masked (for logs and messages)."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: nothing to mask there either
        return url


def one_line(text: Any) -> str:
    return re.sub(r"\[Errno \d+\] ", "", " ".join(str(text).split()))


def config_shown(settings: Settings) -> str:
    return str(Path(settings.config_path).resolve()) if settings.config_path is not None else "the configuration"


def int_at_least(minimum: int, what: str) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number ({what})") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is out of range ({what})")
        return value

    return parse


def port_number(text: str) -> int:
    value = int_at_least(0, "a TCP port, 0 to 65535")(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is out of range (a TCP port, 0 to 65535)")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def existing_store_engine(settings: Settings) -> Any:
    """An engine on the configured store, which must exist (these commands only read it)."""
    import os

    import sqlalchemy as sa

    from broker_core.sql import make_engine

    url = settings.store_url
    if url.startswith("sqlite"):
        path = sa.engine.make_url(url.split("?", 1)[0]).database
        if path and path != ":memory:" and not path.startswith("file:") and not os.path.exists(path):
            raise CommandError(
                f"{shown_url(url)}: no store there yet (the gateway creates it when it first starts); "
                "check store.url and the current directory"
            )
    return make_engine(url, sqlite_pooled=False)
