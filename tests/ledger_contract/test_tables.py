"""ledger_contract.tables: how ``document`` and ``reply`` are stored (LZ4 frames when smaller)."""

from __future__ import annotations

import os

import pytest

from ledger_contract.tables import LZ4_MAGIC, PACK_OVER, pack_xml, unpack_xml

BIG = (
    b"<?xml version='1.0' encoding='UTF-8'?><Order>"
    + b"".join(b"<Line n='%d'><Item>Widget \xc3\xa9 %d</Item></Line>" % (n, n) for n in range(300))
    + b"</Order>"
)


@pytest.mark.parametrize(
    "data", [b"", b"<a/>", LZ4_MAGIC, LZ4_MAGIC + b"<not a frame>", LZ4_MAGIC + BIG, os.urandom(PACK_OVER * 2), BIG]
)
def test_pack_xml_never_confuses_raw_bytes_with_a_frame(data):
    packed = pack_xml(data)
    assert unpack_xml(packed) == data
    assert packed.startswith(LZ4_MAGIC) == (data.startswith(LZ4_MAGIC) or len(packed) < len(data))
