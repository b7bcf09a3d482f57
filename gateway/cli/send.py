"""``b2bgw send``: submit a document in-process as a configured partner, or post it to a running gateway."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.cli.support import CommandError, one_line, positive_seconds, settings_for, to_stderr
from gateway.errors import GatewayError

__all__ = ["register"]


def register(sub: Any, with_config: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]) -> None:
    """Add ``send`` to the commands (*sub*)."""
    p = with_config(sub.add_parser("send", help="submit a document; print the receipt or the reply"))
    p.add_argument("file", help="the XML document")
    p.add_argument("--partner", "-p", help="send as this partner (in-process, on the configured store)")
    p.add_argument("--url", help="post to the gateway at this base URL instead (needs --key)")
    p.add_argument("--key", help="the partner's API key, with --url (default: $B2BGW_API_KEY)")
    p.add_argument("--correlation-id")
    p.add_argument("--idempotency-key")
    p.add_argument("--timeout", type=positive_seconds, default=60.0, help="HTTP timeout in seconds, with --url")
    p.set_defaults(func=cmd_send)


def _print_outcome(outcome: Any) -> None:
    if outcome.reply is not None:
        sys.stdout.write(outcome.reply.decode("utf-8", errors="replace"))
        if not outcome.reply.endswith(b"\n"):
            sys.stdout.write("\n")
        to_stderr(f"message id {outcome.message_id}, correlation id {outcome.correlation_id}, route {outcome.route}")
    else:
        print(json.dumps(outcome.receipt, indent=2))


def _send_http(args: argparse.Namespace, body: bytes) -> int:
    import httpx

    key = args.key or os.environ.get("B2BGW_API_KEY")
    if not key:
        raise CommandError("--url needs --key KEY (or $B2BGW_API_KEY): the partner's API key")
    try:
        base = httpx.URL(args.url)
    except httpx.InvalidURL as exc:
        base = None
        reason = str(exc)
    else:
        reason = "it needs http:// or https:// and a host"
    if base is None or base.scheme not in ("http", "https") or not base.host:
        raise CommandError(
            f"--url {args.url!r} is not a gateway URL ({reason}); give its base URL, e.g. http://127.0.0.1:8080"
        )
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/xml"}
    if args.correlation_id:
        headers["X-Correlation-ID"] = args.correlation_id
    if args.idempotency_key:
        headers["Idempotency-Key"] = args.idempotency_key
    url = args.url.rstrip("/") + "/v1/documents"
    try:
        response = httpx.post(url, content=body, headers=headers, timeout=args.timeout)
    except httpx.TimeoutException:
        to_stderr(
            f"no answer from {url} within {args.timeout:g} s: the document may or may not have been accepted; "
            "send it again with the same --idempotency-key, or a larger --timeout"
        )
        return 1
    except httpx.HTTPError as exc:
        raise CommandError(
            f"cannot reach {url}: {one_line(exc) or type(exc).__name__}; is the gateway running "
            "there (b2bgw serve)? check --url"
        ) from None
    text = response.text
    if response.status_code in (200, 202):
        print(text if response.status_code == 200 else json.dumps(response.json(), indent=2))
        if response.status_code == 200:
            to_stderr(
                f"message id {response.headers.get('x-message-id')}, "
                f"correlation id {response.headers.get('x-correlation-id')}"
            )
        return 0
    to_stderr(f"HTTP {response.status_code}")
    to_stderr(text)
    return 1


def cmd_send(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        body = path.read_bytes()
    except OSError as exc:
        raise CommandError(f"{path}: {exc.strerror or exc}; give the path of the XML document to send") from None
    if args.url:
        return _send_http(args, body)
    if not args.partner:
        raise CommandError("send needs --partner P (or --url URL --key KEY to post to a running gateway)")

    from gateway.exchange.assemble import assemble_or_raise
    from gateway.problems import problem_body
    from gateway.runtime.serving import Runtime

    settings = settings_for(args)
    assembly = assemble_or_raise(settings)
    partner = assembly.partners.get(args.partner)
    if partner is None:
        raise CommandError(
            f"no partner {args.partner!r} is configured in {settings.config_path}; use one of: "
            f"{', '.join(sorted(assembly.partners.partners)) or '(none)'}"
        )
    if len(body) > settings.limits.max_bytes:
        to_stderr(
            f"{path}: {len(body)} bytes is over the {settings.limits.max_bytes} bytes limit (limits.max_body_bytes): "
            "the gateway refuses it"
        )
        return 1
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    try:
        assert runtime.gateway is not None
        outcome = asyncio.run(
            runtime.gateway.submit(
                partner, body, correlation_id=args.correlation_id, idempotency_key=args.idempotency_key
            )
        )
    except GatewayError as exc:
        to_stderr(json.dumps(problem_body(exc), indent=2, ensure_ascii=False))
        return 1
    finally:
        runtime.stop()
    _print_outcome(outcome)
    return 0
