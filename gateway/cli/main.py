"""The ``b2bgw`` command line: the parser and the dispatch to the commands.

The commands live in modules of their own, each with a ``register`` that adds its parsers:
:mod:`gateway.cli.serve` (serve, stomp, worker), :mod:`gateway.cli.send` (send), :mod:`gateway.cli.queues`
(queues, browse, dlq), :mod:`gateway.cli.db` (db upgrade, stats, vacuum), :mod:`gateway.cli.archive`
(archive), :mod:`gateway.cli.config` (routes check, rules check, key new, operator new), and ``spark_etl.cli``
(etl) when the warehouse load is installed, :mod:`gateway.cli.as2` (as2 keys new, as2 cert).

``-c/--config FILE`` and ``--log-level`` go before or after the command. Exit status: 0 done, 1 failed (a
document refused, errors found, the reason on stderr), 2 a user error (bad arguments, configuration, file, URL,
queue, or a store that cannot be opened: one line on stderr saying what is wrong and what to do). docs/cli.md is
the user's page.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, NoReturn

from gateway.cli import archive as archive_cli
from gateway.cli import as2 as as2_cli
from gateway.cli import config as config_cli
from gateway.cli import db as db_cli
from gateway.cli import deliveries as deliveries_cli
from gateway.cli import partners as partners_cli
from gateway.cli import queues as queue_cli
from gateway.cli import send as send_cli
from gateway.cli import serve as serve_cli
from gateway.cli.support import CommandError, one_line, shown_url, to_stderr
from gateway.config.loader import default_config_path
from gateway.errors import ConfigError, GatewayError
from gateway.telemetry.logs import own as own_log_handler

__all__ = ["main", "build_parser"]


def _user_error(exc: BaseException) -> str | None:
    """The one-line message for *exc* if it is a user error (exit status 2), else None (a bug: traceback)."""
    from broker_core import InvalidDestinationError, InvalidSelectorError, StoreError, StoreUnavailableError

    if isinstance(exc, CommandError | argparse.ArgumentError | argparse.ArgumentTypeError):
        return one_line(exc)  # the last two: an option a command checks itself (etl run --since)
    if isinstance(exc, ConfigError):
        return one_line(f"configuration error: {exc}")
    if isinstance(exc, InvalidSelectorError):
        return one_line(
            f"bad selector: {str(exc).splitlines()[0]}; write a JMS (SQL-92) condition on the message "
            "properties, e.g. \"InvoiceID = 'A-1' AND TotalAmount > 100\""
        )
    if isinstance(exc, InvalidDestinationError):
        return one_line(f"{exc}; name a queue as queue://NAME or NAME")
    if isinstance(exc, StoreError):
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        for word in text.split():  # the store's message quotes its URL, password included
            if "://" in word:
                text = text.replace(word.rstrip(":,;"), shown_url(word.rstrip(":,;")))
        if isinstance(exc, StoreUnavailableError):
            text += "; check store.url in the configuration (or $B2BGW_STORE_URL) and that the database is running"
        return one_line(text)
    import sqlalchemy.exc

    if isinstance(exc, sqlalchemy.exc.ArgumentError):
        return one_line(
            f"the store URL cannot be used: {str(exc).splitlines()[0]}; write it as sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST/DB"
        )
    if isinstance(exc, sqlalchemy.exc.OperationalError):
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        return one_line(f"cannot use the database: {reason}; check the store URL and that the database is running")
    if isinstance(exc, OSError) and exc.filename is not None:
        return one_line(f"{exc.filename}: {exc.strerror or exc}; check the path and its permissions")
    return None


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line saying where to look (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}; see `{self.prog} --help`\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extra = super().parse_known_args(args, namespace)
        if not hasattr(parsed, "_parser_prog"):  # the innermost (sub)command parser returns first
            parsed._parser_prog = self.prog
        return parsed, extra

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:  # reported by the command they were given to, not by `b2bgw`
            prog = getattr(parsed, "_parser_prog", self.prog)
            self.exit(2, f"{prog}: unrecognized arguments: {' '.join(extra)}; see `{prog} --help`\n")
        return parsed


class _VersionAction(argparse.Action):
    """``--version``: the installed package's version (looked up only when asked)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("b2bgw")
        except PackageNotFoundError:  # run from a source tree that is not installed
            text = "unknown (not installed: pip install -e .)"
        sys.stdout.write(f"b2bgw {text}\n")
        parser.exit(0)


_LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="b2bgw",
        description="B2B XML integration gateway",
        epilog="Exit status: 0 done, 1 failed, 2 a user error (the reason on stderr). "
        "Configuration without -c: $B2BGW_CONFIG, else ./config/b2bgw.yaml, else ./b2bgw.yaml.",
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    # -c and --log-level go before or after the command; each command keeps its own copy (same meaning) so
    # that `b2bgw serve -c FILE` and `b2bgw -c FILE serve` both work; main() merges them (the command's wins).
    parser.add_argument(
        "-c",
        "--config",
        dest="global_config",
        metavar="FILE",
        help="the configuration file (default: $B2BGW_CONFIG, ./config/b2bgw.yaml, ./b2bgw.yaml)",
    )
    parser.add_argument(
        "--log-level",
        dest="global_log_level",
        choices=_LOG_LEVELS,
        type=str.upper,
        help="log level (default: $B2BGW_LOG_LEVEL, else INFO)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def with_log_level(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--log-level", choices=_LOG_LEVELS, type=str.upper, help="log level (default: $B2BGW_LOG_LEVEL, else INFO)"
        )
        return p

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "-c",
            "--config",
            metavar="FILE",
            help="the configuration file (default: $B2BGW_CONFIG, ./config/b2bgw.yaml, ./b2bgw.yaml)",
        )
        return with_log_level(p)

    def needs_action(group: argparse.ArgumentParser, name: str) -> Any:
        actions = group.add_subparsers(dest=f"{name}_command", metavar="ACTION")

        def missing(_args: argparse.Namespace) -> int:
            raise CommandError(f"choose an action: {', '.join(actions.choices)}; see `b2bgw {name} --help`")

        group.set_defaults(func=missing)
        return actions

    serve_cli.register(sub, with_config)  # serve, stomp, worker
    send_cli.register(sub, with_config)
    partners_cli.register(sub, with_config)  # partners
    deliveries_cli.register(sub, with_config)  # deliveries (show, replay, discard), deliver
    queue_cli.register(sub, with_config, needs_action)  # queues, browse, dlq replay

    db = needs_action(sub.add_parser("db", help="database"), "db")
    db_cli.register(db, with_config)  # db upgrade
    archive_cli.register(sub, with_config, needs_action)  # archive ...

    config_cli.register(sub, with_config, with_log_level, needs_action)  # routes check, rules check, key, operator
    as2_cli.register(sub, with_config, needs_action)  # as2 keys new, as2 cert

    try:  # the warehouse load adds `etl run` / `etl status` (pyspark is an optional extra)
        from spark_etl.cli import register  # type: ignore[import-not-found]
    except ImportError:
        pass
    else:
        register(sub)
    return parser


def _command_name(args: argparse.Namespace) -> str:
    words = ["b2bgw"]
    command = getattr(args, "command", None)
    if command:
        words.append(command)
        action = getattr(args, f"{command}_command", None)
        if isinstance(action, str):
            words.append(action)
    return " ".join(words)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    if getattr(args, "config", None) is None:  # given before the command (or not at all)
        args.config = args.global_config
    if args.config is None and args.command == "etl":  # the warehouse load looks where the other commands look
        found = default_config_path()
        args.config = None if found is None else str(found)
    level = getattr(args, "log_level", None) or args.global_log_level or os.environ.get("B2BGW_LOG_LEVEL", "INFO")
    args.log_level = level.upper() if level.upper() in _LOG_LEVELS else "INFO"
    index = getattr(args, "process_index", None)
    before = set(logging.getLogger().handlers)
    logging.basicConfig(
        level=getattr(logging, args.log_level, logging.INFO),
        format="%(asctime)s %(levelname)s "
        + ("" if index is None else f"[process {index}] ")
        + "%(name)s: %(message)s",
    )
    for handler in set(logging.getLogger().handlers) - before:  # serve's logging.format replaces it
        own_log_handler(handler)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if args.command not in ("serve", "worker"):
        logging.getLogger().setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        return int(func(args) or 0)
    except GatewayError as exc:
        if not isinstance(exc, ConfigError):  # a document refused
            to_stderr(str(exc))
            return 1
        to_stderr(f"{_command_name(args)}: {_user_error(exc)}")
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        text = _user_error(exc)
        if text is None:  # a bug: its traceback is what helps
            raise
        to_stderr(f"{_command_name(args)}: {text}")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
