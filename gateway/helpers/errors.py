"""Gateway errors across a helper process's pipe: a refusal made in a worker reaches the partner as the
same class, detail and fields, and anything malformed becomes a plain 500 rather than a trusted error
(:func:`error_to_data`, :func:`error_from_data`); and a schema error report worked out by a child that parsed
hostile bytes, trusted with nothing more than a bounded list of numbers and strings (:func:`report_to_data`,
:func:`report_from_data`)."""

from __future__ import annotations

from typing import Any

from gateway.errors import GatewayError, InvalidDocumentError, SchemaValidationError, XMLErrorDetail, clip

__all__ = ["error_from_data", "error_to_data", "report_from_data", "report_to_data"]


def error_to_data(error: GatewayError) -> dict[str, Any]:
    """A gateway error as plain data: its class, detail, listed errors and plain fields."""
    data: dict[str, Any] = {"type": f"{type(error).__module__}.{type(error).__qualname__}", "detail": error.detail}
    if isinstance(error, InvalidDocumentError):
        data["errors"] = [[e.line, e.column, e.path, e.message] for e in error.errors]
        data["omitted"] = error.omitted
    data["fields"] = {
        name: value
        for name, value in vars(error).items()
        if name not in ("detail", "errors", "omitted") and (value is None or isinstance(value, (str, int, float, bool)))
    }
    return data


def _error_classes() -> dict[str, type[GatewayError]]:
    found: dict[str, type[GatewayError]] = {}
    todo: list[type[GatewayError]] = [GatewayError]
    while todo:
        cls = todo.pop()
        found[f"{cls.__module__}.{cls.__qualname__}"] = cls
        todo.extend(cls.__subclasses__())
    return found


def _plain(value: Any) -> Any:
    if isinstance(value, str):
        return clip(value, 1000)
    return value if value is None or isinstance(value, (int, float, bool)) else None


def error_from_data(data: Any) -> GatewayError:
    """The error :func:`error_to_data` described, as its own class (one of the gateway's); anything else, or
    anything malformed, is a plain :class:`GatewayError` (a 500: the worker failed)."""
    try:
        cls = _error_classes().get(data["type"])
        if cls is None:
            return GatewayError()
        error = cls.__new__(cls)
        fields = {
            name: _plain(value)
            for name, value in dict(data.get("fields") or {}).items()
            if isinstance(name, str)
            and name.isidentifier()
            and not name.startswith("_")
            and name not in ("detail", "errors", "omitted")
        }
        for name, value in fields.items():
            setattr(error, name, value)
        detail = clip(str(data["detail"]) or cls.default_detail, 4000)
        error.detail = detail
        Exception.__init__(error, detail)
        if isinstance(error, InvalidDocumentError):
            error.errors = [
                XMLErrorDetail(
                    _position(line), _position(column), path if isinstance(path, str) else None, str(message)
                )
                for line, column, path, message in list(data["errors"])[: cls.max_errors]
            ]
            omitted = data.get("omitted")
            error.omitted = omitted if isinstance(omitted, int) and omitted >= 0 else 0
        return error
    except (KeyError, TypeError, ValueError):
        return GatewayError()


def _position(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


# --------------------------------------------------------------------------- schema error reports


def report_to_data(error: SchemaValidationError) -> dict[str, Any]:
    """A schema error report as plain data: its detail, errors, omitted count and schema."""
    return {
        "detail": error.detail,
        "errors": [[e.line, e.column, e.path, e.message] for e in error.errors],
        "omitted": error.omitted,
        "schema": error.schema,
    }


def report_from_data(data: Any) -> SchemaValidationError | None:
    """The report :func:`report_to_data` described, checked field by field and bounded as the error's own
    constructor bounds it (None for anything malformed, or a report without errors)."""
    try:
        details = []
        for item in data["errors"][: SchemaValidationError.max_errors]:
            line, column, path, message = item
            details.append(
                XMLErrorDetail(
                    _position(line), _position(column), path if isinstance(path, str) else None, str(message)
                )
            )
        omitted = _position(data.get("omitted")) or 0
        schema = data.get("schema")
        if not details or not isinstance(data["detail"], str):
            return None
        return SchemaValidationError(
            data["detail"], details, omitted=omitted, schema=schema if isinstance(schema, str) else None
        )
    except (KeyError, TypeError, ValueError):
        return None
