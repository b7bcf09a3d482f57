"""Partner trust: HTTPS on the gateway's own listeners, client certificates as partner identity, trusted
reverse proxies, API key windows, and warnings before any key or certificate expires.

* :mod:`~gateway.trust.settings` parses ``server.tls``, ``server.trusted_proxies``, ``server.client_cert_header``,
  ``server.partners_reload`` and ``server.expiry_warning``;
* :mod:`~gateway.trust.tls` builds the server's :class:`ssl.SSLContext` and reloads its certificate;
* :mod:`~gateway.trust.https_only` starts TLS on each connection, answering plain HTTP 400;
* :mod:`~gateway.runtime.trust_serving` gives uvicorn (partner API and admin listener) those protocols;
* :mod:`~gateway.trust.peer` reads the client certificate of a request (the TLS connection, or a trusted
  proxy's header) and the client address a trusted proxy forwarded;
* :mod:`~gateway.trust.pins` parses each partner's pins, key windows and authentication policy;
* :mod:`~gateway.http.auth` authenticates a request by that policy;
* :mod:`~gateway.runtime.partners_watch` re-reads the partners file while serving;
* :mod:`~gateway.trust.expiry` lists what expires when, for ``b2bgw partners`` (:mod:`~gateway.cli.partners`), a
  metric and a log warning.
"""
