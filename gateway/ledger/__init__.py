"""The document ledger: its rows, the status reconciler, its statistics and its migrations."""
