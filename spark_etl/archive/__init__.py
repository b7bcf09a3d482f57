"""The archive job: documents past their retention leave the ledger for the warehouse's ``archive_document``
table, verified, then purged; and :func:`get` brings one back.

Due are the documents in a final status whose last change is older than their rule's ``online``
(:mod:`ledger_contract.retention`) and, when the warehouse load is on, that it has read (all their ledger
events at or under its watermark): the warehouse never misses a document that left the ledger first.
``archive_document`` (Parquet, partitioned by ``received_date``, one file per batch and date) keeps each
document's ledger record, status history, request and reply XML with their SHA-256, and its ``batch_id``.

One batch at a time, each step recorded in the journal (``b2b_archive_batches``) before the next:
``writing`` (file names recorded, files written under a temporary name, synced, renamed), ``written``
(every file read back: exactly the batch's documents, each XML's SHA-256 the ledger's), ``verified`` (the
documents purged, a few hundred per store transaction paced by :class:`ledger_contract.lifecycle.Pacer`,
each leaving a tombstone), ``purged``. A batch's purge runs in a thread while the next batch is written,
and need not wait for the disk: a purge lost to a power cut is redone, its batch still ``verified``.

The next run first finishes what a dead one left: ``writing`` -> files removed; ``written`` -> verified and
purged, or removed; ``verified`` -> purged again. So no document is purged that is not in a verified file,
and none is in two. Rules with ``after: purge`` skip the files (a batch of kind ``purge``). Then expired
tombstones are dropped and, on SQLite, the freed pages given back (:func:`ledger_contract.space.vacuum`).
One process at a time runs the job, under the ``archive`` lease of ``etl_lock``.

The modules: :mod:`.model` (the table, the records returned, where the
archive lives), :mod:`.errors`, :mod:`.files` (the Parquet side: write, read
back, check, remove), :mod:`.job` (the batches through the journal),
:mod:`.read` (:func:`get`, :func:`verify`) and :mod:`.schedule`.
"""

from .errors import ArchiveBusyError, ArchiveError, ArchiveStoppedError
from .job import hooks, run, store_writer
from .model import ARCHIVE_TABLE, LEASE_NAME, ArchivedDocument, ArchiveResult, archive_root
from .read import get, verify
from .schedule import ArchiveSchedule

__all__ = [
    "ARCHIVE_TABLE",
    "ArchiveBusyError",
    "ArchiveError",
    "ArchiveStoppedError",
    "ArchiveResult",
    "ArchiveSchedule",
    "ArchivedDocument",
    "LEASE_NAME",
    "archive_root",
    "get",
    "hooks",
    "run",
    "store_writer",
    "verify",
]
