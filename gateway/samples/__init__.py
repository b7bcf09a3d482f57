"""Sample handlers built on :mod:`gateway.handlers`.

Importing this package registers nothing; import a sample module (for
example :mod:`gateway.samples.order_responder`) to register its handler in
:data:`gateway.handlers.registry`.
"""
