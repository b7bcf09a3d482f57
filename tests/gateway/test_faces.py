"""The names users import: the package's face, the handler author's API and the documented module paths."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest

import gateway
import gateway.handlers

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", gateway.__all__)
def test_every_name_of_the_gateway_face_imports(name: str) -> None:
    assert getattr(gateway, name) is not None
    assert name in dir(gateway)


def test_the_handler_face_names_the_authors_api_and_no_registry_internals() -> None:
    face = set(gateway.handlers.__all__)
    assert {"handler", "Reject", "BusinessError", "HandlerContext", "AsyncHandlerContext", "Worker"} <= face
    assert not face & {"Handler", "HandlerRegistry"}
    for name in face:
        assert getattr(gateway.handlers, name) is not None


def test_the_documented_paths_keep_working() -> None:
    from gateway.handlers import BusinessError, Reject, handler
    from gateway.testing import HandlerHarness

    assert gateway.Reject is Reject and gateway.BusinessError is BusinessError and gateway.handler is handler
    assert gateway.HandlerHarness is HandlerHarness


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        gateway.no_such_name  # noqa: B018


def _modules(package: str) -> list[str]:
    base = ROOT / package
    found = []
    for path in sorted(base.rglob("*.py")):
        if "migrations" in path.parts or path.name == "__main__.py":
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


PACKAGES = ["gateway", "broker_core", "spark_etl", "ledger_contract"]


@pytest.mark.parametrize("package", PACKAGES)
def test_loggers_are_named_after_their_modules(package: str) -> None:
    """A logger's name says where a line comes from: ``getLogger(__name__)``, never a name typed by hand."""
    typed = re.compile(r"""^\s*\w+\s*=\s*logging\.getLogger\(\s*["']""", re.M)
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / package).rglob("*.py")
        if typed.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_every_gateway_module_imports_on_its_own() -> None:
    names = _modules("gateway")
    assert [importlib.import_module(name).__name__ for name in names] == names
