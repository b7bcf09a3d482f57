"""``b2bgw etl run`` answers in one line: Spark's own output (the JDK's notices, log4j's banner, its WARN
lines) stays out of the terminal unless ``--verbose`` asks for it. Run as a user runs it: a process of its own,
whose JVM is started by the command (not the tests' shared session)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from etltest import EXAMPLES, Ledger, example

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="Java is not installed (PySpark needs it)")


def _etl_run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}
    env.pop("B2BGW_CONFIG", None)
    env.pop("B2BGW_STORE_URL", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli.main",
            "etl",
            "run",
            "--db-url",
            f"sqlite:///{tmp_path / 'ledger.db'}",
            "--warehouse",
            str(tmp_path / "warehouse"),
            "--master",
            "local[1]",
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
        timeout=600,
    )


def test_etl_run_prints_one_line_and_spark_only_with_verbose(tmp_path):
    if not EXAMPLES.is_dir():
        pytest.skip(f"the OASIS UBL examples are not at {EXAMPLES}")
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.add("o1", "Order", example("UBL-Order-2.1-Example.xml"))
    ledger.engine.dispose()

    quiet = _etl_run(tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == "", f"Spark's output reached the terminal: {quiet.stderr[:2000]}"
    lines = quiet.stdout.splitlines()
    assert len(lines) == 1 and "succeeded" in lines[0] and "1 documents read, 1 loaded" in lines[0], quiet.stdout

    verbose = _etl_run(tmp_path, "--full", "--verbose")
    assert verbose.returncode == 0, verbose.stderr
    assert "log4j" in verbose.stderr or " WARN " in verbose.stderr, verbose.stderr[:2000]
    assert verbose.stdout.splitlines()[-1].startswith("etl run ")
