"""Names the project holds itself to: every exception it defines is named ``...Error`` (or ``...Warning``),
and every module's logger is named after it (``logging.getLogger(__name__)``, never a hand-written copy of a
module path), so a log line says where it came from. A handler's own logger is named after the handler."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("broker_core", "gateway", "ledger_contract", "spark_etl")
#: Handler authors' documented outcome marker: raised or returned, read as a verb ("reject this message").
NOT_ERRORS = {"gateway.handlers.api.Reject"}


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package)
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, f"{package}."):
            if ".migrations." in info.name or info.name.endswith(".migrations"):
                continue
            names.append(info.name)
    return names


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts)


@pytest.mark.parametrize("name", _modules())
def test_exceptions_are_named_error(name: str) -> None:
    module = importlib.import_module(name)
    wrong = [
        cls.__qualname__
        for cls in vars(module).values()
        if inspect.isclass(cls)
        and issubclass(cls, BaseException)
        and cls.__module__ == name
        and not cls.__name__.endswith(("Error", "Warning"))
        and f"{name}.{cls.__qualname__}" not in NOT_ERRORS
    ]
    assert wrong == [], f"{name}: exceptions must be named ...Error: {wrong}"


def test_loggers_are_named_after_their_modules() -> None:
    wrong = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and isinstance(getattr(node.func.value, "id", None), str)
                and node.func.value.id == "logging"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and ast.unparse(node.args[0]).strip("'\"f").startswith(PACKAGES)
            ):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert wrong == [], f"loggers not named after their module (logging.getLogger(__name__)): {wrong}"


def test_what_is_started_is_stopped() -> None:
    """One pair of lifecycle verbs: what has ``start()`` ends with ``stop()``; ``close()`` releases what was
    opened (connections, sessions, stores, files), as in JMS, and is never the pair of ``start()``."""
    wrong = []
    for path in _sources():
        if path.parts[len(ROOT.parts)] == "broker_core":
            continue  # JMS's own verbs: Connection.start/stop pause delivery, close releases
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                methods = {m.name for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)}
                if "start" in methods and ("stop" not in methods or methods & {"close", "shutdown", "aclose"}):
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert wrong == [], f"classes whose start() is not paired with stop() alone: {wrong}"
