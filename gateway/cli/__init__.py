"""The ``b2bgw`` command line: one module per command group."""
