"""Every error spark_etl raises on purpose is a SparkEtlError, and still the built-in kind it was."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from spark_etl import archive, cli, config, job, source, state, ubl
from spark_etl.errors import SparkEtlError

WHAT = "what went wrong"


@pytest.mark.parametrize(
    "make, builtin",
    [
        (lambda: config.EtlSettingError("etl.read_partitions", WHAT), ValueError),
        (lambda: job.EtlError(WHAT), RuntimeError),
        (lambda: job.LockBusyError(WHAT), RuntimeError),
        (lambda: job.ReconciliationError([WHAT], (0, 10)), RuntimeError),
        (lambda: state.LockLostError(WHAT), RuntimeError),
        (lambda: ubl.BadFactsError(WHAT), ValueError),
        (lambda: source.RelativeStorePathError("sqlite:///b2b.db", WHAT), ValueError),
        (lambda: archive.ArchiveError(WHAT), RuntimeError),
        (lambda: archive.ArchiveBusyError(WHAT), RuntimeError),
        (lambda: archive.ArchiveStoppedError(WHAT), RuntimeError),
        (lambda: cli._UsageError(WHAT), Exception),
    ],
    ids=lambda v: getattr(v, "__name__", "make"),
)
def test_caught_as_the_root_and_as_the_builtin(make: Callable[[], Exception], builtin: type[Exception]) -> None:
    error = make()
    assert type(error).__name__.endswith("Error")
    with pytest.raises(SparkEtlError, match=WHAT):
        raise error
    with pytest.raises(builtin):
        raise make()
