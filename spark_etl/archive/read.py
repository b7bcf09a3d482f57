"""Reading the archive back: one document by message id (:func:`get`), and
every file checked against its batch's journal (:func:`verify`)."""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa

from ledger_contract.tables import archive_batches, documents, tombstones

from .model import ARCHIVE_TABLE, ArchivedDocument


def _files_of(engine: sa.Engine, batch_id: int) -> list[dict[str, Any]]:
    import json

    with engine.connect() as conn:
        raw = conn.execute(sa.select(archive_batches.c.files).where(archive_batches.c.batch_id == batch_id)).scalar()
        conn.rollback()
    return json.loads(raw) if raw else []


def get(message_id: str, *, root: str, engine: sa.Engine | None = None) -> ArchivedDocument | None:
    """The archived document *message_id* (its ledger record, request and reply XML, status history), or
    None when the archive does not hold it. With *engine* (the gateway's store) its tombstone says which
    file holds it; without (or once the tombstone has expired), every file of the archive is searched."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    candidates: list[str] = []
    if engine is not None:
        with engine.connect() as conn:
            batch = conn.execute(sa.select(tombstones.c.batch_id).where(tombstones.c.message_id == message_id)).scalar()
            conn.rollback()
        if batch is not None:
            candidates = [os.path.join(root, f["path"]) for f in _files_of(engine, int(batch))]
    for path in candidates:
        if not os.path.exists(path):
            continue
        found = _find_in_file(pq.ParquetFile(path), message_id)
        if found is not None:
            return _document(found, path)
    base = os.path.join(root, ARCHIVE_TABLE)
    if not os.path.isdir(base):
        return None
    dataset = ds.dataset(base, format="parquet", partitioning="hive")
    if not dataset.files:
        return None
    table = dataset.to_table(filter=ds.field("message_id") == message_id)
    if table.num_rows == 0:
        return None
    rows = table.to_pylist()
    row = max(rows, key=lambda r: r["archived_at"])
    return _document(row, base)


def _find_in_file(pf: Any, message_id: str) -> dict[str, Any] | None:
    offset = 0
    ids = pf.read(columns=["message_id"]).column("message_id").to_pylist()
    try:
        index = ids.index(message_id)
    except ValueError:
        return None
    for group in range(pf.num_row_groups):
        n = pf.metadata.row_group(group).num_rows
        if index < offset + n:
            return pf.read_row_group(group).slice(index - offset, 1).to_pylist()[0]
        offset += n
    return None  # pragma: no cover - the index is within the file


def _document(row: dict[str, Any], path: str) -> ArchivedDocument:
    request = (row.pop("request_xml") or "").encode("utf-8")
    reply = row.pop("reply_xml")
    history = row.pop("history") or []
    return ArchivedDocument(
        message_id=row["message_id"],
        record=row,
        request=request,
        reply=reply.encode("utf-8") if reply is not None else None,
        history=history,
        archived_at=row["archived_at"],
        file=path,
    )


def verify(engine: sa.Engine, root: str) -> dict[str, Any]:
    """Check that the archive and the ledger agree: every purged batch's files are there with their rows;
    every tombstone of an archived document is in its batch's files; no tombstoned document is still in the
    ledger; no document is in the archive twice. ``{"ok": bool, "problems": [...], ...counts}``."""
    import json

    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    problems: list[str] = []
    archived_ids: dict[int, set[str]] = {}
    with engine.connect() as conn:
        batches = [
            dict(r._mapping)
            for r in conn.execute(
                sa.select(archive_batches).where(
                    archive_batches.c.kind == "archive", archive_batches.c.status.in_(("purged", "expired"))
                )
            )
        ]
        for b in batches:
            files = json.loads(b["files"]) if b["files"] else []
            ids: set[str] = set()
            for f in files:
                path = os.path.join(root, f["path"])
                if not os.path.exists(path):
                    problems.append(f"batch {b['batch_id']}: {path} is missing")
                    continue
                ids.update(pq.read_table(path, columns=["message_id"]).column("message_id").to_pylist())
            if len(ids) != b["documents"]:
                problems.append(f"batch {b['batch_id']}: {len(ids)} documents in its files, {b['documents']} recorded")
            archived_ids[b["batch_id"]] = ids
        tomb_rows = conn.execute(sa.select(tombstones.c.message_id, tombstones.c.batch_id, tombstones.c.archived)).all()
        online = conn.execute(
            sa.select(sa.func.count())
            .select_from(documents)
            .where(documents.c.message_id.in_(sa.select(tombstones.c.message_id)))
        ).scalar_one()
        conn.rollback()
    missing = [
        r.message_id for r in tomb_rows if r.archived and r.message_id not in archived_ids.get(r.batch_id, set())
    ]
    if missing:
        problems.append(f"{len(missing)} archived tombstones have no row in their batch's files (e.g. {missing[0]})")
    if online:
        problems.append(f"{online} documents are both in the ledger and tombstoned")
    duplicates = 0
    base = os.path.join(root, ARCHIVE_TABLE)
    total = 0
    if os.path.isdir(base):
        dataset = ds.dataset(base, format="parquet", partitioning="hive")
        ids = dataset.to_table(columns=["message_id"]) if dataset.files else None
        total = ids.num_rows if ids is not None else 0
    if total:
        duplicates = total - len(set(ids.column("message_id").to_pylist()))
        if duplicates:
            problems.append(f"{duplicates} documents are in the archive more than once")
    return {
        "ok": not problems,
        "problems": problems,
        "archive_rows": total,
        "tombstones": len(tomb_rows),
        "batches": len(batches),
        "duplicates": duplicates,
    }
