"""``b2bgw as2 keys new`` (our AS2 key pair and self-signed certificate) and ``b2bgw as2 cert PARTNER`` (what
to send a partner so it can configure us)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.cli.support import CommandError, settings_for

__all__ = ["register"]


def register(
    sub: Any,
    with_config: Callable[[argparse.ArgumentParser], argparse.ArgumentParser],
    needs_action: Callable[[argparse.ArgumentParser, str], Any],
) -> None:
    """Add ``as2 keys new`` and ``as2 cert`` to the commands (*sub*)."""
    as2 = needs_action(sub.add_parser("as2", help="AS2 partners: keys and certificates"), "as2")
    keys = as2.add_parser("keys", help="our AS2 key pair").add_subparsers(dest="keys_command", metavar="ACTION")
    p = keys.add_parser("new", help="make an RSA key and a self-signed certificate for our AS2 id")
    p.add_argument("--id", required=True, help="our AS2 id (what partners put in AS2-To)")
    p.add_argument("--out", default="config/as2", help="folder for as2-key.pem and as2-cert.pem (default: config/as2)")
    p.add_argument("--days", type=int, default=730, help="the certificate's validity in days (default: 730)")
    p.add_argument("--bits", type=int, choices=[2048, 3072, 4096], default=3072, help="RSA key size (default: 3072)")
    p.add_argument("--force", action="store_true", help="replace existing files")
    p.set_defaults(func=cmd_keys_new)
    p = with_config(as2.add_parser("cert", help="print our AS2 id, URL and certificate for a partner"))
    p.add_argument("partner", metavar="PARTNER", help="the partner's id in partners.yaml")
    p.add_argument("--url", help="our public AS2 URL (default: http://<server.host>:<server.port>/as2)")
    p.set_defaults(func=cmd_cert)


def cmd_keys_new(args: argparse.Namespace) -> int:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    from gateway.as2.config import AS2_ID

    if not AS2_ID.match(args.id):
        raise CommandError(f"--id {args.id!r}: an AS2 id is 1-128 printable ASCII characters without spaces")
    if not 1 <= args.days <= 3650:
        raise CommandError("--days must be from 1 to 3650")
    out = Path(args.out)
    key_path, cert_path = out / "as2-key.pem", out / "as2-cert.pem"
    if not args.force and (key_path.exists() or cert_path.exists()):
        raise CommandError(
            f"{key_path} or {cert_path} exists; pass --force to replace them (partners holding "
            "the old certificate must then get the new one)"
        )
    key = rsa.generate_private_key(public_exponent=65537, key_size=args.bits)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, args.id[:64])])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=args.days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=True,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    print(f"wrote {key_path} (private: keep it, mode 0600) and {cert_path} (public: partners get it)")
    print("add to the gateway configuration:\n")
    print(f"as2:\n  id: {args.id}\n  key: {key_path}\n  certificate: {cert_path}")
    return 0


def cmd_cert(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives import hashes, serialization

    settings = settings_for(args)
    if settings.as2 is None:
        raise CommandError("the configuration has no `as2:` section; make our keys with `b2bgw as2 keys new`")
    from gateway.routing.partners import PartnerRegistry

    partner = PartnerRegistry.from_settings(settings).get(args.partner)
    if partner is None:
        raise CommandError(f"no partner {args.partner!r} in the configuration")
    if partner.as2 is None:
        raise CommandError(f"partner {args.partner!r} has no `as2:` entry in partners.yaml")
    ours, agreement = settings.as2, partner.as2
    cert = ours.identity.certificate
    url = args.url or f"http://{settings.host}:{settings.port}/as2"
    fingerprint = cert.fingerprint(hashes.SHA256()).hex(":").upper()
    print(f"# AS2 agreement: {partner.name} ({agreement.id}) -> us ({ours.id})")
    print(f"Our AS2 id (your AS2-To):       {ours.id}")
    print(f"Your AS2 id (your AS2-From):    {agreement.id}")
    print(f"Our URL:                        {url}")
    print(
        f"Signing required:               {'yes' if agreement.require_signature else 'no'} "
        f"(SHA-256 or stronger{'; SHA-1 allowed' if agreement.allow_sha1 else ''})"
    )
    print(
        f"Encryption required:            {'yes' if agreement.require_encryption else 'no'} "
        f"(AES-128/256, CBC or GCM{'; 3DES allowed' if agreement.allow_3des else ''})"
    )
    print("Compression:                    accepted (zlib, RFC 5402)")
    print("MDN:                            synchronous, signed on request (SHA-256)")
    if agreement.async_mdn_urls:
        print(f"Asynchronous MDN URLs:          {', '.join(agreement.async_mdn_urls)} (and below)")
    else:
        print("Asynchronous MDN URLs:          none agreed (ask for synchronous MDNs)")
    print(
        f"Certificate valid:              {cert.not_valid_before_utc:%Y-%m-%d} to {cert.not_valid_after_utc:%Y-%m-%d}"
    )
    print(f"Certificate SHA-256:            {fingerprint}")
    print("# our certificate (for your encryption and for verifying our MDNs and messages):")
    print(cert.public_bytes(serialization.Encoding.PEM).decode("ascii"), end="")
    return 0
