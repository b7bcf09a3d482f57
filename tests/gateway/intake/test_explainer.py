"""gateway.intake.explainer: the error report of an invalid document, worked out in a helper process within a
time budget. What matters to the serving process: the report comes in time or not at all, the work is
killed when its time is up, nothing a child sends is trusted beyond a checked list of numbers and strings,
and the helper goes away with the serving process.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from gwtest import INVOICE

from gateway.errors import SchemaValidationError
from gateway.helpers.errors import report_from_data
from gateway.intake.explainer import Explainer
from gateway.intake.xmlsafe import DEFAULT_LIMITS


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return found


@pytest.fixture(scope="module")
def explainer(gw_registry):
    # 2,000 attributes per element allowed: xmlschema's report of one such element takes seconds
    limits = dataclasses.replace(DEFAULT_LIMITS, max_attributes=2_000)
    explainer = Explainer(gw_registry, limits, timeout=1.0, restart_interval=0)
    explainer.start()
    deadline = time.monotonic() + 60
    while not explainer.ready:
        assert time.monotonic() < deadline, "the helper did not start"
        time.sleep(0.05)
    yield explainer
    explainer.stop()


BAD = INVOICE.replace(b"<cbc:IssueDate>2009-12-15", b"<cbc:IssueDate>15.12.2009").replace(
    b"<cbc:InvoiceTypeCode", b"<cbc:Bogus>1</cbc:Bogus><cbc:InvoiceTypeCode"
)


def test_the_full_report_of_an_invalid_document_comes_in_time(explainer):
    started = time.perf_counter()
    report = explainer.explain(BAD, None, "ubl-2.1/Invoice")
    assert time.perf_counter() - started < 1.1
    assert isinstance(report, SchemaValidationError) and report.schema == "ubl-2.1/Invoice"
    paths = [e.path for e in report.errors]
    assert "/Invoice/cbc:IssueDate" in paths and all(e.line for e in report.errors)


def test_a_valid_or_refused_document_gets_no_report(explainer):
    assert explainer.explain(INVOICE, None, "ubl-2.1/Invoice") is None
    assert explainer.explain(b"<Invoice", None, "ubl-2.1/Invoice") is None  # not well-formed: the caller's


def test_a_report_over_its_time_is_cut_off_and_its_work_killed(explainer):
    attrs = b" ".join(b'a%d="v"' % i for i in range(1_500))
    slow = INVOICE.replace(b"<Invoice ", b"<Invoice " + attrs + b" ", 1)
    started = time.perf_counter()
    report = explainer.explain(slow, None, "ubl-2.1/Invoice")
    took = time.perf_counter() - started
    assert took < 1.3
    if report is not None:  # libxml2's report, sent before xmlschema's work began: located, all the same
        assert report.errors and report.errors[0].line
    helper = explainer._process.pid
    deadline = time.monotonic() + 2
    while _children(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _children(helper)  # the child that worked on it was killed
    assert explainer.explain(BAD, None, "ubl-2.1/Invoice") is not None  # and the helper goes on


def test_the_budget_counts_from_when_the_intake_began(explainer):
    attrs = b" ".join(b'a%d="v"' % i for i in range(1_500))
    slow = INVOICE.replace(b"<Invoice ", b"<Invoice " + attrs + b" ", 1)  # xmlschema takes seconds on it
    started = time.perf_counter()
    explainer.explain(slow, None, "ubl-2.1/Invoice", started=time.monotonic() - 0.8)  # 0.8 s of 1 s gone
    assert time.perf_counter() - started < 0.5
    fallbacks = explainer.counts["fallback"]
    started = time.perf_counter()
    assert explainer.explain(BAD, None, "ubl-2.1/Invoice", started=time.monotonic() - 1.5) is None  # all gone
    assert time.perf_counter() - started < 0.05
    assert explainer.counts["fallback"] == fallbacks + 1
    assert explainer.explain(BAD, None, "ubl-2.1/Invoice", started=time.monotonic()) is not None  # a whole budget


def test_documents_over_the_size_budget_are_left_to_the_caller(gw_registry):
    explainer = Explainer(gw_registry, DEFAULT_LIMITS, max_bytes=1000)
    assert explainer.explain(BAD, None, "ubl-2.1/Invoice") is None
    assert explainer.counts["fallback"] == 1 and explainer._process is None  # nothing started for it


@pytest.mark.parametrize(
    "data",
    [
        None,
        {},
        {"errors": "x", "detail": "d"},
        {"errors": [[1, 2, 3]], "detail": "d"},
        {"errors": [], "detail": "d"},
        {"errors": [[1, 2, None, "m"]], "detail": 5},
    ],
)
def test_what_a_child_sends_is_checked(data):
    assert report_from_data(data) is None


def test_what_a_child_sends_is_bounded():
    report = report_from_data(
        {
            "errors": [[-1, "x", 7, "m" * 10_000]] * 500,
            "detail": "d" * 10_000,
            "omitted": -5,
            "schema": ["not", "a", "string"],
        }
    )
    assert report is not None and len(report.errors) == SchemaValidationError.max_errors
    first = report.errors[0]
    assert (first.line, first.column, first.path) == (None, None, None) and len(first.message) <= 300
    assert report.omitted == 0 and report.schema is None and len(report.detail) <= 500


def test_the_helper_goes_away_with_its_explainer(gw_registry):
    explainer = Explainer(gw_registry, DEFAULT_LIMITS)
    explainer.start()
    deadline = time.monotonic() + 60
    while not explainer.ready:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process = explainer._process
    explainer.stop()
    assert process.wait(10) is not None
