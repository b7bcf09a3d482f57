"""A type checker (mypy) checks a handler's signature against @handler, and the
packages say they are typed (PEP 561: a ``py.typed`` marker, shipped)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api", reason="mypy is a test dependency (pip install -e '.[test]')")

REPO = Path(__file__).resolve().parents[3]

GOOD = """
from lxml import etree
from broker_core import Message
from gateway.handlers import AsyncHandlerContext, BusinessError, HandlerContext, Reject, handler

@handler("a", registry=None)
def plain(message: Message, context: HandlerContext) -> etree._Element:
    context.send("audit", "<Audit/>").jms_message_id
    return etree.Element("Reply")

@handler("b", registry=None)
async def coroutine(message: Message, context: AsyncHandlerContext) -> str | None:
    sent = await context.send("audit", "<Audit/>")
    return sent.jms_message_id

@handler("c", registry=None)
def outcomes(message: Message, context: HandlerContext) -> Reject | BusinessError | Message:
    if message.jms_type is None:
        return Reject("no type")
    return BusinessError("code", "detail")

reveal_type(plain)
reveal_type(coroutine)
"""

#: line (1-based) -> what mypy must say there
BAD = """
from broker_core import Message
from gateway.handlers import AsyncHandlerContext, HandlerContext, handler

@handler("a", registry=None)
def returns_a_number(message: Message, context: HandlerContext) -> int:
    return 1

@handler("b", registry=None)
async def async_given_the_plain_context(message: Message, context: HandlerContext) -> None:
    return None

@handler("c", registry=None)
def plain_given_the_async_context(message: Message, context: AsyncHandlerContext) -> None:
    return None

@handler("d", registry=None)
def no_context(message: Message) -> None:
    return None

@handler("e", registry=None)
async def send_not_awaited(message: Message, context: AsyncHandlerContext) -> None:
    context.send("audit", "<Audit/>").jms_message_id
"""
BAD_LINES = {5: "arg-type", 9: "arg-type", 13: "arg-type", 17: "arg-type", 23: "attr-defined"}


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory) -> Path:
    """One cache for the module's runs: the second checks only its own file."""
    return tmp_path_factory.mktemp("mypy_cache")


def mypy(tmp_path: Path, cache: Path, source: str) -> list[str]:
    path = tmp_path / "handlers_under_check.py"
    path.write_text(source, encoding="utf-8")
    out, err, _ = mypy_api.run(
        ["--follow-imports=silent", "--no-error-summary", "--show-error-codes", "--cache-dir", str(cache), str(path)]
    )
    assert not err, err
    return [line for line in out.splitlines() if line.strip()]


def test_well_typed_handlers_pass_and_keep_their_types(tmp_path, mypy_cache):
    lines = mypy(tmp_path, mypy_cache, GOOD)
    assert not [line for line in lines if ": error:" in line], lines
    notes = [line for line in lines if "Revealed type" in line]
    assert "HandlerContext], lxml.etree._element._Element]" in notes[0]
    assert "AsyncHandlerContext], typing.Awaitable[str | None]]" in notes[1]


def test_wrong_signatures_are_errors(tmp_path, mypy_cache):
    errors = {}
    for line in mypy(tmp_path, mypy_cache, BAD):
        found = re.match(r".*?:(\d+): error: .*\[([a-z-]+)\]$", line)
        if found:
            errors[int(found.group(1))] = found.group(2)
    assert errors == BAD_LINES


def test_the_packages_are_marked_typed_and_ship_the_marker():
    for package in ("gateway", "broker_core", "ledger_contract", "spark_etl"):
        assert (REPO / package / "py.typed").is_file(), package
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    package_data = project["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["*"]
