"""ledger_contract's errors: a document the warehouse cannot take is a LedgerContractError and a ValueError."""

from __future__ import annotations

import pytest
from lxml import etree

from ledger_contract import facts
from ledger_contract.errors import LedgerContractError


def test_a_root_that_is_not_the_ledger_s_type_is_caught_as_the_root() -> None:
    root = etree.fromstring(b'<Invoice xmlns="urn:oasis:names:specification:ubl:schema:xsd:Invoice-2"/>')
    with pytest.raises(LedgerContractError, match="the ledger says Order") as caught:
        facts.check_root(root, "Order")
    assert isinstance(caught.value, facts.BadDocumentError)
    assert isinstance(caught.value, ValueError)
