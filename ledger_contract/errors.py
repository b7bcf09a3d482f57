"""The root of ledger_contract's errors::

    LedgerContractError
    └── BadDocumentError (ValueError)  ledger_contract.facts: a document the warehouse cannot take

``ValueError`` stays a base so that code catching it still does.
"""

from __future__ import annotations

__all__ = ["LedgerContractError"]


class LedgerContractError(Exception):
    """An error ledger_contract raises on purpose (the message says what went wrong)."""
