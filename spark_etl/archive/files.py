"""The Parquet side of the archive: a batch's rows to a table, written to files
(temporary name, synced, renamed), read back and checked against the ledger's
SHA-256 of each XML, or removed."""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
from typing import Any

from ledger_contract.tables import unpack_xml

from .errors import ArchiveError
from .model import ROW_GROUP


def _schema() -> Any:
    import pyarrow as pa

    ts = pa.timestamp("ms", tz="UTC")
    return pa.schema(
        [
            ("message_id", pa.string()),
            ("partner", pa.string()),
            ("doc_type", pa.string()),
            ("doc_namespace", pa.string()),
            ("doc_id", pa.string()),
            ("idempotency_key", pa.string()),
            ("correlation_id", pa.string()),
            ("route", pa.string()),
            ("destination", pa.string()),
            ("status", pa.string()),
            ("received_at", ts),
            ("updated_at", ts),
            ("archived_at", ts),
            ("digest", pa.string()),
            ("request_sha256", pa.string()),
            ("reply_sha256", pa.string()),
            ("request_xml", pa.string()),
            ("reply_xml", pa.string()),
            ("reply_type", pa.string()),
            ("receipt", pa.string()),
            ("error", pa.string()),
            ("history", pa.list_(pa.struct([("seq", pa.int64()), ("status", pa.string()), ("at", ts)]))),
            ("batch_id", pa.int64()),
        ]
    )


_XML_COLUMNS = ("request_xml", "reply_xml")


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


_DAYS: dict[int, str] = {}


def _day(ms: int) -> str:
    """The UTC date of epoch milliseconds, ``YYYY-MM-DD``."""
    day = ms // 86_400_000
    text = _DAYS.get(day)
    if text is None:
        text = _DAYS[day] = _dt.datetime.fromtimestamp(day * 86400, _dt.UTC).strftime("%Y-%m-%d")
    return text


def _table(
    rows: list[dict[str, Any]], history: dict[str, list[tuple[int, str, int]]], batch_id: int, archived_at: int
) -> tuple[Any, dict[str, tuple[str, str | None]], dict[str, tuple[bytes, bytes | None]]]:
    """The Arrow table of *rows*, the SHA-256 of each one's request and reply, and those bytes (the
    ledger's), by message id."""
    import pyarrow as pa

    ts = pa.timestamp("ms", tz="UTC")
    requests = [unpack_xml(row["document"]) or b"" for row in rows]
    replies = [unpack_xml(row["reply"]) for row in rows]
    request_sha = [_sha(x) for x in requests]
    reply_sha = [_sha(x) for x in replies]
    ids = [row["message_id"] for row in rows]
    expected = dict(zip(ids, zip(request_sha, reply_sha, strict=False), strict=False))
    originals = dict(zip(ids, zip(requests, replies, strict=False), strict=False))
    offsets, seqs, statuses, ats = [0], [], [], []
    for mid in ids:
        for seq, status, at in history.get(mid, ()):
            seqs.append(seq)
            statuses.append(status)
            ats.append(at)
        offsets.append(len(seqs))
    events = pa.StructArray.from_arrays(
        [pa.array(seqs, pa.int64()), pa.array(statuses, pa.string()), pa.array(ats, pa.int64()).cast(ts)],
        names=["seq", "status", "at"],
    )
    cols: dict[str, Any] = {
        name: pa.array([row[name] for row in rows], pa.string())
        for name in (
            "partner",
            "doc_type",
            "doc_namespace",
            "doc_id",
            "idempotency_key",
            "correlation_id",
            "route",
            "destination",
            "status",
            "digest",
            "reply_type",
            "receipt",
            "error",
        )
    }
    cols["message_id"] = pa.array(ids, pa.string())
    for name in ("received_at", "updated_at"):
        cols[name] = pa.array([row[name] for row in rows], pa.int64()).cast(ts)
    cols["archived_at"] = pa.array([archived_at] * len(rows), pa.int64()).cast(ts)
    cols["request_sha256"] = pa.array(request_sha, pa.string())
    cols["reply_sha256"] = pa.array(reply_sha, pa.string())
    # the ledger's XML is UTF-8: the cast checks it, in C++
    cols["request_xml"] = pa.array(requests, pa.binary()).cast(pa.string())
    cols["reply_xml"] = pa.array(replies, pa.binary()).cast(pa.string())
    cols["history"] = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), events)
    cols["batch_id"] = pa.array([batch_id] * len(rows), pa.int64())
    schema = _schema()
    return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema), expected, originals


def _write_file(table: Any, path: str) -> int:
    """Write *table* to *path* durably: a temporary name in the same directory (ignored by readers: it
    starts with an underscore), synced, renamed, the directory synced. Its size."""
    import pyarrow.parquet as pq

    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, "_tmp-" + os.path.basename(path))
    other = [n for n in table.column_names if n not in _XML_COLUMNS]
    pq.write_table(
        table,
        tmp,
        compression="zstd",
        compression_level=3,
        row_group_size=ROW_GROUP,
        use_dictionary=[
            n
            for n in other
            if n not in ("message_id", "idempotency_key", "correlation_id", "request_sha256", "reply_sha256", "receipt")
        ],
        write_statistics=[n for n in other if n != "history"],
    )
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _sync_dir(directory)
    return os.path.getsize(path)


def _sync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - not on a POSIX file system
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _remove_files(root: str, files: list[dict[str, Any]]) -> None:
    for f in files:
        path = os.path.join(root, f["path"])
        for p in (path, os.path.join(os.path.dirname(path), "_tmp-" + os.path.basename(path))):
            try:
                os.remove(p)
            except FileNotFoundError:
                pass


def _read_back(
    root: str,
    files: list[dict[str, Any]],
    originals: dict[str, tuple[bytes, bytes | None]] | None = None,
    expected: dict[str, tuple[str, str | None]] | None = None,
) -> dict[str, tuple[str | None, str | None, int, str, str | None]]:
    """``message_id -> (sha of request read back, of reply, updated_at ms, stored request sha, stored reply
    sha)`` of the batch's files; ArchiveError when one is missing or has a message id twice. With the
    *originals* just written (and their *expected* SHA-256), XML read back that is byte for byte the
    original is given the original's SHA-256 without hashing it again (else a value no SHA-256 has)."""
    import pyarrow.parquet as pq

    def sha(mid: str, data: bytes | None, which: int) -> str | None:
        if originals is None or expected is None or mid not in originals:
            return _sha(data)
        return expected[mid][which] if data == originals[mid][which] else "(differs)"

    out: dict[str, tuple[str | None, str | None, int, str, str | None]] = {}
    for f in files:
        path = os.path.join(root, f["path"])
        if not os.path.exists(path):
            raise ArchiveError(f"archive file {path} is missing")
        table = pq.read_table(
            path, columns=["message_id", "updated_at", "request_xml", "reply_xml", "request_sha256", "reply_sha256"]
        )
        if table.num_rows != f["rows"]:
            raise ArchiveError(f"archive file {path} holds {table.num_rows} rows, {f['rows']} were written")
        ids = table.column("message_id").to_pylist()
        updated = table.column("updated_at").cast("int64").to_pylist()
        requests = table.column("request_xml").cast("binary").to_pylist()
        replies = table.column("reply_xml").cast("binary").to_pylist()
        stored_req = table.column("request_sha256").to_pylist()
        stored_rep = table.column("reply_sha256").to_pylist()
        for i, mid in enumerate(ids):
            if mid in out:
                raise ArchiveError(f"archive file {path}: message {mid} twice in one batch")
            out[mid] = (sha(mid, requests[i], 0), sha(mid, replies[i], 1), updated[i], stored_req[i], stored_rep[i])
    return out


def _check(read: dict[str, tuple[Any, ...]], expected: dict[str, tuple[str, str | None]]) -> list[str]:
    """What does not match between the files read back and the ledger's digests (empty: all good)."""
    problems = []
    if set(read) != set(expected):
        missing, extra = set(expected) - set(read), set(read) - set(expected)
        problems.append(f"{len(missing)} documents missing from the files, {len(extra)} not of the batch")
    for mid, (req, rep) in expected.items():
        got = read.get(mid)
        if got is None:
            continue
        if got[0] != req or got[3] != req:
            problems.append(f"{mid}: the request XML read back does not have the ledger's SHA-256")
        if got[1] != rep or got[4] != rep:
            problems.append(f"{mid}: the reply XML read back does not have the ledger's SHA-256")
    return problems
