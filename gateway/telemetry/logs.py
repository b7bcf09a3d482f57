"""Structured logs: ``logging.format: text | json`` in the configuration.

Both formats carry a timestamp, the level and the logger, and, where known,
what the line is about: ``partner``, ``message_id``, ``correlation_id``,
``route`` and ``problem`` (the RFC 9457 problem code of a refusal). Those come
from context variables set while a request is handled (:func:`bind`), so
every line logged during a request carries them, uvicorn's access line
included (it is logged inside the request's task, and goes through the same
formatter: :func:`uvicorn_log_config`).

A JSON line::

    {"ts":"2025-06-01T12:00:00.123Z","level":"INFO","logger":"uvicorn.access",
     "message":"127.0.0.1:50312 - \\"POST /v1/documents HTTP/1.1\\" 202","partner":"acme",
     "message_id":"ID:...","correlation_id":"PO-1","route":"orders","status":202}
"""

from __future__ import annotations

import contextvars
import json
import logging
from typing import Any

from broker_core.clock import iso_ms
from gateway.telemetry.log_escape import escape_block, escape_controls

__all__ = [
    "CONTEXT_FIELDS",
    "ContextFilter",
    "JsonFormatter",
    "TextFormatter",
    "bind",
    "configure",
    "field",
    "set_partner",
    "set_problem",
    "fresh",
    "restore",
    "uvicorn_log_config",
]

#: The request context a log line carries when known, in this order.
CONTEXT_FIELDS = ("partner", "auth", "message_id", "correlation_id", "route", "problem")
#: The current request's context fields: one dictionary per request (:func:`fresh`), filled as it goes.
_FIELDS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("b2bgw_log", default=None)
FORMATS = ("text", "json")


def bind(**values: str | None) -> None:
    """Set context fields (``partner=...``, ``message_id=...``; None clears one) for the rest of the request."""
    fields = _FIELDS.get()
    if fields is None:
        fields = {}
        _FIELDS.set(fields)
    for name, value in values.items():
        if value is None:
            fields.pop(name, None)
        else:
            fields[name] = value


def set_partner(partner: str) -> None:
    """``bind(partner=...)`` for the intake's hot path."""
    fields = _FIELDS.get()
    if fields is None:
        _FIELDS.set({"partner": partner})
    else:
        fields["partner"] = partner


def set_problem(code: str) -> None:
    """``bind(problem=...)``: the RFC 9457 code a request is refused with."""
    fields = _FIELDS.get()
    if fields is None:
        _FIELDS.set({"problem": code})
    else:
        fields["problem"] = code


def field(name: str) -> str | None:
    """One context field of the current request, if set."""
    fields = _FIELDS.get()
    return None if fields is None else fields.get(name)


def fresh(fields: dict[str, str] | None = None) -> contextvars.Token[dict[str, str] | None]:
    """Start a request's context (the ASGI server may run several requests in one task) in *fields* (a new
    dictionary, which the caller may fill directly); :func:`restore` ends it."""
    return _FIELDS.set({} if fields is None else fields)


def restore(token: contextvars.Token[dict[str, str] | None]) -> None:
    _FIELDS.reset(token)


def context() -> dict[str, str]:
    """The context fields set now, in :data:`CONTEXT_FIELDS` order."""
    fields = _FIELDS.get()
    if not fields:
        return {}
    return {name: fields[name] for name in CONTEXT_FIELDS if name in fields}


class ContextFilter(logging.Filter):
    """Copies the context fields onto each record (``record.b2bgw``), where the formatters find them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "b2bgw"):
            record.b2bgw = context()
        return True


def _timestamp(created: float) -> str:
    return iso_ms(int(created * 1000))


def _access_fields(record: logging.LogRecord) -> dict[str, Any]:
    """uvicorn's access record carries (client, method, path, version, status) in ``args``."""
    if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
        client, method, path, _, status = record.args
        return {"client": client, "method": method, "path": path, "status": status}
    return {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, the context fields, then exception text."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update(getattr(record, "b2bgw", None) or {})
        out.update(_access_fields(record))
        process = getattr(record, "b2bgw_process", None)
        if process is not None:
            out["process"] = process
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``2025-06-01T12:00:00.123Z INFO logger: message [partner=acme message_id=ID:...]``."""

    def __init__(self, process: int | None = None) -> None:
        super().__init__()
        self._process = "" if process is None else f"[process {process}] "

    def format(self, record: logging.LogRecord) -> str:
        message = escape_controls(record.getMessage())  # one event, one line (gateway.telemetry.log_escape)
        line = f"{_timestamp(record.created)} {record.levelname} {self._process}{record.name}: {message}"
        fields = getattr(record, "b2bgw", None)
        if fields:
            line += " [" + " ".join(f"{k}={escape_controls(str(v))}" for k, v in fields.items()) + "]"
        if record.exc_info:
            line += "\n" + escape_block(self.formatException(record.exc_info))
        if record.stack_info:
            line += "\n" + escape_block(self.formatStack(record.stack_info))
        return line


class _ProcessFilter(logging.Filter):
    def __init__(self, process: int | None) -> None:
        super().__init__()
        self.process = process

    def filter(self, record: logging.LogRecord) -> bool:
        record.b2bgw_process = self.process
        return True


def _handler(fmt: str, process: int | None) -> logging.Handler:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(process))
    handler.addFilter(ContextFilter())
    if process is not None:
        handler.addFilter(_ProcessFilter(process))
    return handler


def own(handler: logging.Handler) -> logging.Handler:
    """Mark *handler* as the gateway's: :func:`configure` replaces it (an embedding program's handlers stay)."""
    handler._b2bgw = True  # type: ignore[attr-defined]
    return handler


def configure(fmt: str = "text", level: int | str = logging.INFO, process: int | None = None) -> None:
    """Send every log record (the root logger's, uvicorn's included) to stderr in *fmt*."""
    if fmt not in FORMATS:
        raise ValueError(f"logging.format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    root = logging.getLogger()
    for old in list(root.handlers):  # a handler of an earlier call; others (an embedding program's) stay
        if getattr(old, "_b2bgw", False):
            root.removeHandler(old)
    root.addHandler(own(_handler(fmt, process)))
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = True


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's ``log_config``: its loggers keep no handler of their own and propagate to the root's
    (set by :func:`configure`), so its access lines have the same format, timestamp and context."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "loggers": {
            # NOTSET: the root's level applies unless uvicorn is given a log_level of its own
            "uvicorn": {"handlers": [], "propagate": True, "level": "NOTSET"},
            "uvicorn.error": {"handlers": [], "propagate": True, "level": "NOTSET"},
            "uvicorn.access": {"handlers": [], "propagate": True, "level": "NOTSET"},
        },
    }
