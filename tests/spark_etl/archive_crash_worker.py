"""Runs the archive job on a store and kills its own process (SIGKILL: no cleanup, no finally) at one step of
one batch: ``python archive_crash_worker.py URL ROOT STEP BATCH``. Steps are :data:`spark_etl.archive.hooks`
names: ``file_written`` (one file of the batch on disk), ``written`` (all files, before the journal says so),
``before_verify``, ``verified`` (before the purge), ``purging`` (the purge's first transaction committed)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from archivetest import open_store, policy

from ledger_contract.lifecycle import Pacer
from spark_etl import archive


def main() -> None:
    url, root, step, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    broker = open_store(url)

    def die(batch_id: int) -> None:
        if batch_id >= batch:  # the batch to die in (the earlier ones complete)
            os.kill(os.getpid(), signal.SIGKILL)

    archive.hooks[step] = die
    archive.run(
        policy(batch=40),
        engine=broker.engine,
        write=archive.store_writer(broker),
        purge_write=archive.store_writer(broker, durable=False),
        root=root,
        wait_for_warehouse=False,
        now=int(time.time() * 1000),
        pacer=Pacer(first=7, most=7, least=7, rest=0, busy_rest=0),
        lease_ttl=1.0,
    )
    print("finished without dying", flush=True)
    broker.close()
    sys.exit(3)


if __name__ == "__main__":
    main()
