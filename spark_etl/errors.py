"""The root of spark_etl's errors: ``except SparkEtlError`` catches anything
the load or the archive job raises on purpose.

Each error lives with the module that raises it::

    SparkEtlError
    ├── EtlSettingError (ValueError)         spark_etl.config: a bad ``etl:`` setting
    ├── EtlError (RuntimeError)              spark_etl.job: the load failed (recorded in etl_runs)
    │   ├── LockBusyError                    another process runs the load
    │   └── ReconciliationError              staged facts do not add up to the window
    ├── LockLostError (RuntimeError)         spark_etl.state: the run's lease was taken over
    ├── BadFactsError (ValueError)           spark_etl.ubl: stored facts that do not read as their schema
    ├── RelativeStorePathError (ValueError)  spark_etl.source: a relative SQLite path on a cluster
    ├── ArchiveError (RuntimeError)          spark_etl.archive.errors: the archive job could not do its work
    │   ├── ArchiveBusyError                 another process runs it
    │   └── ArchiveStoppedError              asked to stop between two steps
    └── _UsageError                          spark_etl.cli: a configuration the command cannot use

The second bases (``ValueError``, ``RuntimeError``) are kept so that code
catching the built-in kind still does.
"""

from __future__ import annotations

__all__ = ["SparkEtlError"]


class SparkEtlError(Exception):
    """An error spark_etl raises on purpose (the message says what went wrong)."""
