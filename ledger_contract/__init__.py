"""The document ledger's contract between the gateway, which writes it, and
the warehouse load and archive job in ``spark_etl``, which read it: its
tables (:mod:`~ledger_contract.tables`), the warehouse facts extracted from a
document (:mod:`~ledger_contract.facts`), the retention policy
(:mod:`~ledger_contract.retention`), what the archive job does to the ledger
(:mod:`~ledger_contract.lifecycle`) and the SQLite store's space
(:mod:`~ledger_contract.space`).

It imports ``broker_core`` and third-party libraries only, never ``gateway``
or ``spark_etl`` (the layers contract of pyproject.toml's ``[tool.importlinter]``).
"""

from .facts import *  # noqa: F403
from .facts import __all__ as _facts
from .lifecycle import *  # noqa: F403
from .lifecycle import __all__ as _lifecycle
from .retention import *  # noqa: F403
from .retention import __all__ as _retention
from .space import *  # noqa: F403
from .space import __all__ as _space
from .tables import *  # noqa: F403
from .tables import __all__ as _tables

__all__ = [*_facts, *_lifecycle, *_retention, *_space, *_tables]
