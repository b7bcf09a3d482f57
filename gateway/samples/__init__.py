"""Sample handlers built on :mod:`gateway.handlers`.

Importing this package registers nothing; import a sample module to
register its handlers in :data:`gateway.handlers.registry`:
:mod:`gateway.samples.order_responder` answers Orders (request-reply),
:mod:`gateway.samples.document_receiver` takes the one-way documents
(Invoices, DespatchAdvices, OrderChanges, OrderCancellations).
"""
