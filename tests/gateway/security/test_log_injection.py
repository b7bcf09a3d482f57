"""The text log format keeps each event on one line: a client's CR/LF or terminal escapes cannot forge a line."""

from __future__ import annotations

import logging
import re

from gateway.telemetry.logs import JsonFormatter, TextFormatter

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [A-Z]+ ")


def _record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("bad\r\n2030-01-01T00:00:00.000Z INFO gateway.admin: forged")
        except ValueError:
            import sys

            exc_info = sys.exc_info()
    return logging.LogRecord("gateway.admin", logging.WARNING, __file__, 1, message, args, exc_info)


def test_crlf_in_a_message_or_a_field_stays_on_the_line():
    forged = "alice\r\n2030-01-01T00:00:00.000Z INFO gateway.admin: login of root [client=10.0.0.1]"
    record = _record("failed login for %s", forged)
    record.b2bgw = {"partner": "acme\nevil\x1b[2J"}  # the context fields, as ContextFilter copies them
    line = TextFormatter().format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert "alice\\r\\n2030-01-01T00:00:00.000Z INFO" in line and "partner=acme\\nevil\\x1b[2J" in line


def test_a_traceback_keeps_its_lines_but_none_looks_like_a_log_line():
    text = TextFormatter().format(_record("failed", exc=True))
    lines = text.split("\n")
    assert LINE.match(lines[0])
    assert len(lines) > 2 and not any(LINE.match(line) for line in lines[1:])
    assert "bad\\r" in text


def test_json_lines_were_already_safe():
    line = JsonFormatter().format(_record("failed login for %s", "a\r\nb"))
    assert "\n" not in line and "\r" not in line
