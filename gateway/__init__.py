"""B2B XML integration gateway.

What users import: the handler author's names (also in :mod:`gateway.handlers`), the test harness
(:mod:`gateway.testing`) and the error hierarchy's root. They load on first use, so that importing one
sub-package (a helper process imports ``gateway.intake``) does not load the broker and the handlers.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "AsyncHandlerContext",
    "BusinessError",
    "GatewayError",
    "HandlerContext",
    "HandlerHarness",
    "Reject",
    "Worker",
    "handler",
]

_WHERE = {
    "AsyncHandlerContext": "gateway.handlers",
    "BusinessError": "gateway.handlers",
    "HandlerContext": "gateway.handlers",
    "Reject": "gateway.handlers",
    "Worker": "gateway.handlers",
    "handler": "gateway.handlers",
    "HandlerHarness": "gateway.handlers.testing",
    "GatewayError": "gateway.errors",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
