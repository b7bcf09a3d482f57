"""Message Disposition Notifications (RFC 3798 as RFC 4130 7.4 uses them): building ours, reading partners'.

An MDN says only what the receiver did: the original Message-ID, the MIC of what was received and the
disposition; its human-readable part names our problem code. It never quotes the payload.
"""

from __future__ import annotations

import base64
import datetime as dt
import email.utils
import os
import re
from dataclasses import dataclass

from cryptography import x509

from gateway.as2 import cms
from gateway.as2.errors import As2Error, As2MdnError
from gateway.as2.mime import MimeLimits, Part, split_multipart

__all__ = ["Mdn", "MdnOut", "build_mdn", "parse_mdn", "wants_signed_mdn", "requested_micalg"]

_ACTION = "automatic-action/MDN-sent-automatically"
_SAFE = re.compile(r"[^ -~]")


@dataclass(frozen=True, slots=True)
class MdnOut:
    """An MDN we made: its top-level headers (for HTTP), its body, the whole MIME entity and its Message-ID."""

    headers: list[tuple[str, str]]
    body: bytes
    message_id: str
    disposition: str

    @property
    def mime(self) -> bytes:
        """The MDN as one MIME entity (what the ledger keeps)."""
        head = "".join(f"{name}: {value}\r\n" for name, value in self.headers)
        return head.encode("latin-1") + b"\r\n" + self.body


@dataclass(frozen=True, slots=True)
class Mdn:
    """An MDN we received, its signature verified when it was signed."""

    original_message_id: str
    disposition: str
    mic: str | None
    mic_alg: str | None
    signed: bool
    text: str

    @property
    def positive(self) -> bool:
        """``processed`` without error or failure modifier (a warning still counts as processed)."""
        kind = self.disposition.split(";", 1)[-1].strip().lower()
        return kind == "processed" or kind.startswith("processed/warning")


def _options(value: str | None) -> dict[str, list[str]]:
    """``Disposition-Notification-Options`` (RFC 4130 7.3): attribute -> [importance, values...]."""
    options: dict[str, list[str]] = {}
    for item in (value or "")[:1000].split(";"):
        name, eq, rest = item.partition("=")
        if eq:
            options[name.strip().lower()] = [v.strip().lower() for v in rest.split(",")]
    return options


def wants_signed_mdn(options: str | None) -> bool:
    """Whether the sender asked for a signed MDN."""
    protocol = _options(options).get("signed-receipt-protocol", [])
    return "pkcs7-signature" in protocol[1:]


def requested_micalg(options: str | None, allow_sha1: bool) -> str | None:
    """The first ``signed-receipt-micalg`` we support (hashlib name), or None."""
    for name in _options(options).get("signed-receipt-micalg", [])[1:]:
        digest = cms.DIGESTS.get(name)
        if digest and (digest != "sha1" or allow_sha1):
            return digest
    return None


def _boundary() -> str:
    return "----=_b2bgw_" + os.urandom(12).hex()


def message_id(our_id: str) -> str:
    return f"<{os.urandom(16).hex()}@{_SAFE.sub('_', our_id).replace(' ', '_')[:64]}>"


def build_mdn(
    *,
    our_id: str,
    partner_id: str,
    original_message_id: str,
    disposition: str,
    text: str,
    mic: str | None,
    signer: cms.Identity | None,
    digest: str = "sha256",
) -> MdnOut:
    """Our MDN for *original_message_id*: ``disposition`` is ``processed`` or ``processed/error: <modifier>``;
    *mic* the ``Received-Content-MIC`` value (``<base64>, <micalg>``) when one was computed."""
    original = _SAFE.sub("", original_message_id)[:998]
    fields = [
        "Reporting-UA: b2bgw",
        f"Original-Recipient: rfc822; {our_id}",
        f"Final-Recipient: rfc822; {our_id}",
        f"Original-Message-ID: {original}",
    ]
    if mic:
        fields.append(f"Received-Content-MIC: {mic}")
    fields.append(f"Disposition: {_ACTION}; {disposition}")
    notification = ("\r\n".join(fields) + "\r\n").encode("ascii")
    human = _SAFE.sub("?", text).encode("ascii")
    report_boundary = _boundary()
    report_type = f'multipart/report; report-type=disposition-notification; boundary="{report_boundary}"'
    report_body = (
        f"--{report_boundary}\r\nContent-Type: text/plain; charset=us-ascii\r\nContent-Transfer-Encoding: 7bit\r\n\r\n".encode(
            "ascii"
        )
        + human
        + b"\r\n"
        + f"--{report_boundary}\r\nContent-Type: message/disposition-notification\r\n"
        "Content-Transfer-Encoding: 7bit\r\n\r\n".encode("ascii")
        + notification
        + f"\r\n--{report_boundary}--\r\n".encode("ascii")
    )
    mid = message_id(our_id)
    headers = [
        ("AS2-Version", "1.2"),
        ("AS2-From", our_id),
        ("AS2-To", partner_id),
        ("Message-ID", mid),
        ("Date", email.utils.formatdate(usegmt=True)),
        ("MIME-Version", "1.0"),
    ]
    if signer is None:
        return MdnOut(headers + [("Content-Type", report_type)], report_body, mid, disposition)
    signed_part = f"Content-Type: {report_type}\r\n\r\n".encode("ascii") + report_body
    signature = base64.encodebytes(cms.sign(signed_part, signer, digest=digest)).replace(b"\n", b"\r\n")
    outer = _boundary()
    body = (
        f"--{outer}\r\n".encode("ascii")
        + signed_part
        + f"\r\n--{outer}\r\n".encode("ascii")
        + b"Content-Type: application/pkcs7-signature; name=smime.p7s\r\nContent-Transfer-Encoding: base64\r\n"
        b"Content-Disposition: attachment; filename=smime.p7s\r\n\r\n"
        + signature
        + f"\r\n--{outer}--\r\n".encode("ascii")
    )
    content_type = (
        f'multipart/signed; protocol="application/pkcs7-signature"; micalg={cms.micalg_name(digest)}; '
        f'boundary="{outer}"'
    )
    return MdnOut(headers + [("Content-Type", content_type)], body, mid, disposition)


def _fields(data: bytes) -> dict[str, str]:
    fields: dict[str, str] = {}
    last = None
    for line in data.decode("latin-1").replace("\r\n", "\n").split("\n")[:100]:
        if line[:1] in (" ", "\t") and last:
            fields[last] += " " + line.strip()
            continue
        name, colon, value = line.partition(":")
        if colon:
            last = name.strip().lower()
            fields[last] = value.strip()
    return fields


def parse_mdn(
    content_type: str,
    body: bytes,
    certificates: list[x509.Certificate],
    *,
    require_signed: bool,
    limits: MimeLimits | None = None,
    now: dt.datetime | None = None,
) -> Mdn:
    """Read an MDN (top-level *content_type* and *body*, as they came over HTTP); a signed one is verified with
    the partner's *certificates*."""
    limits = limits or MimeLimits()
    top = Part([("content-type", content_type)], body, body)
    kind, _ = top.content_type
    signed = False
    try:
        if kind == "multipart/signed":
            parts = split_multipart(top, limits)
            if len(parts) != 2:
                raise As2MdnError("A signed MDN must have two parts.")
            cms.verify_part(parts[1].decoded(), parts[0].raw, certificates, allow_sha1=True, now=now)
            top, signed = parts[0], True
            kind, _ = top.content_type
        elif require_signed:
            raise As2MdnError("The MDN is not signed, but a signed MDN was asked for.")
        if kind != "multipart/report":
            raise As2MdnError(f"An MDN must be multipart/report; got {kind[:60]}.")
        report = split_multipart(top, limits)
    except As2MdnError:
        raise
    except As2Error as exc:
        raise As2MdnError(f"The MDN could not be read or verified: {exc.detail}") from None
    text, notification = "", None
    for part in report:
        part_kind, _ = part.content_type
        if part_kind == "message/disposition-notification":
            notification = _fields(part.decoded())
        elif part_kind == "text/plain" and not text:
            text = part.decoded()[:2000].decode("latin-1")
    if notification is None or "disposition" not in notification:
        raise As2MdnError("The MDN has no message/disposition-notification part with a Disposition.")
    mic, mic_alg = None, None
    if "received-content-mic" in notification:
        value, _, alg = notification["received-content-mic"].partition(",")
        mic, mic_alg = value.strip(), cms.DIGESTS.get(alg.strip().lower(), alg.strip().lower())
    return Mdn(notification.get("original-message-id", ""), notification["disposition"], mic, mic_alg, signed, text)
