"""The archive job's errors (see :mod:`spark_etl.errors` for the whole tree)."""

from __future__ import annotations

from ..errors import SparkEtlError


class ArchiveError(SparkEtlError, RuntimeError):
    """The archive job could not do its work (recorded in ``b2b_archive_runs``; nothing unverified was
    purged): files that do not read back as written, a lost lease, a store error."""


class ArchiveBusyError(ArchiveError):
    """Another process holds the archive lease (it is running the job): nothing was done."""


class ArchiveStoppedError(ArchiveError):
    """The run was asked to stop (the gateway is stopping): it ended between two steps, recorded as
    interrupted; the next run goes on from there."""
