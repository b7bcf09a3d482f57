"""Command line: ``b2bgw etl run|status`` and ``python -m spark_etl run|status``.

``run [--full] [--reparse] [--since ISO] [-c/--config FILE] [--db-url URL]
[--warehouse DIR] [--master MASTER] [--no-progress] [--verbose]`` runs the load
once and answers in one line (progress bar on a terminal; Spark's own log
lines only with ``--verbose``; ``--full --reparse`` rebuilds the warehouse from
the raw XML alone, ignoring the facts the gateway extracted at intake; with
nothing new since the last run it answers so without starting Spark);
``status [-c/--config FILE] [--limit N] [--quarantine] [--json]`` lists the
runs from ``etl_runs`` (and the quarantined documents).

The gateway's CLI calls :func:`register` with its subparsers; every parser
added here sets ``func`` (``args.func(args)`` returns the exit code).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import sys
from typing import Any
from zoneinfo import ZoneInfo

from .errors import SparkEtlError

__all__ = ["format_status", "main", "register"]


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``etl`` command (``run``, ``status``) to an argparse subparsers object."""
    etl = subparsers.add_parser("etl", help="the Spark warehouse load (run it, list its runs)",
                                description="The Spark warehouse load of delivered documents.")  # fmt: skip
    _add_commands(etl)
    etl.set_defaults(func=lambda args: (etl.print_help(), 2)[1])
    return etl


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", dest="etl_config", metavar="FILE",
                   help="the configuration file (default: $B2BGW_CONFIG, else ./config/b2bgw.yaml)")  # fmt: skip
    p.add_argument("--db-url", dest="etl_db_url", metavar="URL", help="store URL (overrides store.url)")


def _add_commands(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="etl_command", metavar="{run,status}")
    run = sub.add_parser("run", help="load the documents delivered since the last successful run")
    run.add_argument("--full", action="store_true", help="rebuild the whole warehouse from the ledger")
    run.add_argument(
        "--reparse",
        action="store_true",
        help="parse every document's XML, ignoring the facts extracted at intake "
        "(with --full: a rebuild from the raw documents alone)",
    )
    run.add_argument("--since", metavar="ISO", help="also reload the documents delivered since this date/time")
    _common(run)
    run.add_argument("--warehouse", metavar="DIR", help="warehouse root (overrides etl.warehouse)")
    run.add_argument("--master", metavar="MASTER", help="Spark master (overrides etl.spark_master)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument(
        "--verbose",
        action="store_true",
        help="show Spark's own log lines (by default they go to a temporary file, named on failure)",
    )
    run.set_defaults(func=cmd_run)
    status = sub.add_parser("status", help="list the load's runs")
    _common(status)
    status.add_argument("--limit", type=int, default=20, help="runs to list (20)")
    status.add_argument("--quarantine", action="store_true", help="also list the quarantined documents")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)


class _UsageError(SparkEtlError):
    """A configuration the command cannot use (its message says what to fix)."""


def _settings(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    import yaml

    from .config import load_settings

    path = getattr(args, "etl_config", None) or getattr(args, "config", None)
    try:
        settings, url = load_settings(path)
    except OSError as exc:
        raise _UsageError(f"cannot read the configuration {exc.filename or path}: {exc.strerror or exc}") from None
    except (ValueError, yaml.YAMLError) as exc:  # not YAML, not a mapping, a bad etl: setting
        where = f" (etl.{exc.key})" if getattr(exc, "key", None) else ""
        raise _UsageError(f"configuration error{where}: {exc}") from None
    url = getattr(args, "etl_db_url", None) or getattr(args, "db_url", None) or url
    if getattr(args, "warehouse", None):
        settings["warehouse"] = args.warehouse
    if getattr(args, "master", None):
        settings["spark_master"] = args.master
    return settings, url


def parse_since(text: str, timezone: str = "UTC") -> _dt.datetime:
    """An ISO date or date-time; naive values are in *timezone*."""
    try:
        value = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--since {text!r} is not an ISO date or date-time") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=ZoneInfo(timezone))
    return value


def cmd_run(args: argparse.Namespace) -> int:
    from .job import EtlError, LockBusyError, run
    from .jvm_output import keep_jvm_output, quiet_jvm
    from .state import LockLostError

    try:
        settings, url = _settings(args)
    except _UsageError as exc:  # a user error, as for every b2bgw command
        print(f"etl: {exc}", file=sys.stderr)
        return 2
    try:
        since = parse_since(args.since, settings.get("timezone") or "UTC") if args.since else None
    except argparse.ArgumentTypeError as exc:
        print(f"etl: {exc}", file=sys.stderr)
        return 2
    progress = not args.no_progress and sys.stderr.isatty()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spark_log = None if getattr(args, "verbose", False) else quiet_jvm()
    try:
        result = run(settings, url, full=args.full, since=since, progress=progress, reparse=args.reparse)
    except LockBusyError as exc:
        print(f"etl: {exc}; nothing done", file=sys.stderr)
        return 3
    except (EtlError, LockLostError) as exc:
        kept = spark_log is not None and os.path.exists(spark_log) and os.path.getsize(spark_log) > 0
        print(f"etl: FAILED: {exc}" + (f" (Spark's own log: {spark_log})" if kept else ""), file=sys.stderr)
        if kept:
            spark_log = None  # kept for the operator
        return 1
    finally:
        keep_jvm_output()  # a later JVM of this process (a test's, say) writes where Spark writes
        if spark_log is not None and os.path.exists(spark_log):
            os.unlink(spark_log)
    if result.nothing_new:
        print(
            f"etl run {result.run_id} ({result.mode}) {result.status}: nothing new: no document was delivered in "
            f"ledger seq ({result.seq_from}, {result.seq_to}]" + ("" if result.spark_started else "; Spark not started")
        )
        return 0
    print(
        f"etl run {result.run_id} ({result.mode}) {result.status}: ledger seq ({result.seq_from}, {result.seq_to}], "
        f"{result.docs_read} documents read, {result.loaded} loaded, {result.quarantined} quarantined, "
        f"{result.skipped} skipped, {result.rows_written} fact rows written in {result.seconds:.1f}s"
    )
    for q in result.quarantine[:20]:
        print(f"  quarantined {q['message_id']} ({q['doc_type']} from {q['partner']}): {q['reason']}")
    if len(result.quarantine) > 20:
        print(f"  ... and {len(result.quarantine) - 20} more (b2bgw etl status --quarantine)")
    return 0


def _ts(ms: int | None) -> str:
    if not ms:
        return "-"
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def format_status(runs: list, watermark: int, quarantine: list[dict] | None = None, n_quarantined: int = 0) -> str:
    header = ["run", "mode", "outcome", "started (UTC)", "ended (UTC)", "read", "written", "watermark", "error"]
    rows = []
    for r in runs:
        error = (r.error or "").strip().splitlines()[0][:100] if r.error else ""
        rows.append([str(r.run_id), r.mode, r.status, _ts(r.started_at), _ts(r.finished_at),
                     "-" if r.docs_read is None else str(r.docs_read),
                     "-" if r.rows_written is None else str(r.rows_written),
                     f"{r.seq_from}->{r.seq_to}", error])  # fmt: skip
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = [f"watermark (ledger event seq): {watermark}; quarantined documents: {n_quarantined}"]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)).rstrip())
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in rows]
    if not rows:
        lines.append("(no runs yet)")
    if quarantine:
        lines.append("")
        lines.append("quarantined documents:")
        for q in quarantine:
            lines.append(f"  {q['message_id']}  {q['doc_type']}  {q['partner']}  run {q['run_id']}: {q['reason']}")
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    import sqlalchemy as sa

    from . import state

    try:
        _, url = _settings(args)
    except _UsageError as exc:  # a user error, as for every b2bgw command
        print(f"etl: {exc}", file=sys.stderr)
        return 2
    engine = state.open_store(url)
    try:
        with engine.connect() as conn:
            runs = state.list_runs(conn, args.limit)
            wm = state.watermark(conn)
            n_q = conn.execute(sa.select(sa.func.count()).select_from(state.quarantine)).scalar_one()
            quarantine = state.list_quarantine(conn) if args.quarantine else None
    finally:
        engine.dispose()
    if args.json:
        out = {
            "watermark": wm,
            "quarantined": n_q,
            "runs": [{k: v for k, v in vars(r).items() if k != "manifest"} for r in runs],
        }
        if quarantine is not None:
            out["quarantine"] = quarantine
        print(json.dumps(out, indent=2, default=str))
    else:
        print(format_status(runs, wm, quarantine, n_q))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m spark_etl run|status ...`` (also the spark-submit entry point)."""
    parser = argparse.ArgumentParser(prog="python -m spark_etl", description="The Spark warehouse load of b2bgw.")
    _add_commands(parser)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args))
