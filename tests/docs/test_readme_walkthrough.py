"""The README's "Try it", run as a new user runs it: its shell blocks in order, with bash and curl, against a
real ``b2bgw serve`` started from the sample configuration on a fresh store.

Each curl command in the README ends with a ``# → STATUS [code] [(Header: value)]`` comment saying what it
gets; this test reads those comments from the README (nothing is restated here) and checks every answer's
status, its problem ``code``, the named header, and the JSON examples the README prints (the receipt's fields,
the business-rule failures' ids). The only change made to the commands is the port (``GW=``): the server
listens on a free one, without its STOMP listener (another may hold 61613 on a shared machine).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
EXAMPLES = ROOT.parent / "shared" / "ubl-2.1" / "xml"

_EXPECT = re.compile(r"#\s*→\s*(\d{3})(?:\s+([a-z][a-z-]*))?(?:\s*\(([^)]*)\))?\s*$")


def try_it() -> tuple[list[str], list[object]]:
    """The "Try it" section's shell blocks, and its JSON examples in order."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Try it", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    examples = [json.loads(body) for body in re.findall(r"```json\n(.*?)```", section, flags=re.DOTALL)]
    return blocks, examples


def commands(block: str) -> list[str]:
    """A block's commands, continuation lines (``\\``, a trailing ``|``, an open ``$(``) joined."""
    out, current = [], ""
    for line in block.splitlines():
        current += line + "\n"
        stripped = re.sub(r"\s+#.*$", "", line).rstrip()
        if stripped.endswith(("\\", "|")) or current.count("$(") > current.count(")"):
            continue
        if current.strip():
            out.append(current)
        current = ""
    return out


def expectations(blocks: list[str]) -> list[tuple[int, str | None, str | None]]:
    """``(status, code, header)`` of every curl command, in order; a curl without its comment fails."""
    found = []
    for block in blocks:
        for command in commands(block):
            if "curl " not in command:
                continue
            match = _EXPECT.search(command.strip())
            assert match, f"README: a curl command without its `# → STATUS [code]` comment:\n{command}"
            found.append((int(match.group(1)), match.group(2), match.group(3)))
    return found


def test_the_readme_says_what_each_command_gets():
    blocks, examples = try_it()
    expected = expectations(blocks)
    assert [status for status, _, _ in expected] == [200, 202, 202, 200, 403, 422, 400], expected
    assert len(examples) == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def checkout(tmp_path):
    """A checkout as the README assumes it: config/, routes/, rules/ and the UBL examples in ../shared, a
    fresh var/, and ``.venv/bin/b2bgw`` (this interpreter's gateway)."""
    if not EXAMPLES.is_dir():
        pytest.skip(f"the OASIS UBL 2.1 examples are not at {EXAMPLES} (the README's prerequisite)")
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (the README's prerequisite)")
    top = tmp_path / "b2bgw"
    top.mkdir()
    for name in ("config", "routes", "rules"):
        shutil.copytree(ROOT / name, top / name)
    (tmp_path / "shared" / "ubl-2.1").mkdir(parents=True)
    (tmp_path / "shared" / "ubl-2.1" / "xml").symlink_to(EXAMPLES)
    (top / "var").mkdir()
    venv_bin = top / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    launcher = f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m gateway.cli.main "$@"\n'
    (venv_bin / "b2bgw").write_text(launcher)
    (venv_bin / "b2bgw").chmod(0o755)
    return top


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("B2BGW_")}
    env["PYTHONPATH"] = str(ROOT)
    env["PYSPARK_PYTHON"] = sys.executable
    return env


@pytest.fixture
def server(checkout):
    port = _free_port()
    log = (checkout / "serve.log").open("wb")
    proc = subprocess.Popen(
        [str(checkout / ".venv" / "bin" / "b2bgw"), "serve", "--port", str(port), "--no-stomp"],
        cwd=checkout,
        env=_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (checkout / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not become ready in 120 s"
            time.sleep(0.3)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


#: Every curl of a block records its status line, headers and body under $ANSWERS (numbered in order), then
#: prints what curl prints; a counter file numbers them across the subshells of $(...).
_RECORDING_CURL = r"""
curl() {
  n=$(( $(cat "$ANSWERS/count") + 1 )); echo "$n" > "$ANSWERS/count"
  command curl -sS -D "$ANSWERS/$n.headers" "$@" | tee "$ANSWERS/$n.body"
}
"""


def test_try_it_in_order_against_a_real_server(checkout, server):
    blocks, examples = try_it()
    expected = expectations(blocks)
    answers = checkout / "answers"
    answers.mkdir()
    (answers / "count").write_text("0")
    script = [_RECORDING_CURL]
    for block in blocks:
        block = re.sub(r"^GW=\S+$", f"GW={server}", block, flags=re.MULTILINE)
        if shutil.which("java") is None:  # the warehouse load needs Java (a README prerequisite for it only)
            block = block.replace(".venv/bin/b2bgw etl run", ": no Java here: etl run left out")
        script.append(block)
    env = {**_env(), "ANSWERS": str(answers)}
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", "\n".join(script)],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"the README's commands failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

    count = int((answers / "count").read_text())
    assert count == len(expected), f"{count} requests made, the README documents {len(expected)}"
    bodies = []
    for n, (status, code, header) in enumerate(expected, start=1):
        head = (answers / f"{n}.headers").read_text()
        body = (answers / f"{n}.body").read_text()
        bodies.append(body)
        got = int(head.split()[1])
        assert got == status, f"request {n}: the README says {status}, the server answered {got}: {body[:500]}"
        if code is not None:
            assert json.loads(body)["code"] == code, f"request {n}: the README says {code}: {body[:500]}"
        if header:
            name, _, value = header.partition(":")
            lines = {
                line.split(":", 1)[0].strip().lower(): line.split(":", 1)[1].strip()
                for line in head.splitlines()[1:]
                if ":" in line
            }
            assert name.strip().lower() in lines, f"request {n}: no {name} header: {head}"
            if value.strip():
                assert lines[name.strip().lower()] == value.strip(), f"request {n}: {name}: {head}"

    order_response, receipt, replay, document_status = bodies[0], bodies[1], bodies[2], bodies[3]
    assert "<OrderResponse" in order_response
    receipt_example, rules_example = examples
    assert set(json.loads(receipt)) == set(receipt_example), "the receipt's fields are not the README's"
    assert {key: json.loads(receipt)[key] for key in ("route", "document_type", "document_id", "status")} == {
        key: receipt_example[key] for key in ("route", "document_type", "document_id", "status")
    }
    assert json.loads(replay) == json.loads(receipt), "the replay did not return the same receipt"
    assert json.loads(document_status)["status"] in ("accepted", "delivered")

    refusal = json.loads(bodies[6])
    assert refusal["code"] == rules_example["code"] and refusal["status"] == rules_example["status"]
    assert [(e["id"], e["flag"]) for e in refusal["errors"]] == [
        (e["id"], e["flag"]) for e in rules_example["errors"]
    ], refusal["errors"]

    # "delivered once the sample invoice receiver has taken it"
    message_id = json.loads(receipt)["message_id"]
    headers = {"Authorization": "Bearer globex-demo.gtQ0VQHxnHu2x3aBBqlE_TqHsM5svX9Dzw52xGagUfA"}
    deadline = time.monotonic() + 60
    while httpx.get(f"{server}/v1/documents/{message_id}", headers=headers).json()["status"] != "delivered":
        assert time.monotonic() < deadline, "the invoice was not delivered within 60 s"
        time.sleep(0.5)

    # the last block: `b2bgw queues` lists the routes' queues; `etl run` answers in one line
    assert "orders.inbound" in done.stdout and "invoices.inbound" in done.stdout
    if shutil.which("java") is not None:
        etl_lines = [line for line in done.stdout.splitlines() if line.startswith("etl run ")]
        assert len(etl_lines) == 1 and "succeeded" in etl_lines[0], done.stdout[-2000:]
        assert (checkout / "var" / "warehouse").is_dir()
