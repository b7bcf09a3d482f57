"""The gateway's helper processes, shared by the intake and the rules: messages on their pipes
(:mod:`~gateway.helpers.framing`), errors across them (:mod:`~gateway.helpers.errors`), the processor time a
job may take (:mod:`~gateway.helpers.budget`) and the processes themselves (:mod:`~gateway.helpers.workers`)."""
