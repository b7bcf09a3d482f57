"""``b2bgw routes check``, ``b2bgw rules check``, ``b2bgw key new`` and ``b2bgw operator new``: check the
configuration, and make the secrets it holds the hashes of."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.cli.support import CommandError, settings_for, shown_url, to_stderr
from gateway.errors import ConfigError, GatewayError

__all__ = ["register"]


def register(
    sub: Any,
    with_config: Callable[[argparse.ArgumentParser], argparse.ArgumentParser],
    with_log_level: Callable[[argparse.ArgumentParser], argparse.ArgumentParser],
    needs_action: Callable[[argparse.ArgumentParser, str], Any],
) -> None:
    """Add ``routes check``, ``rules check``, ``key new`` and ``operator new`` to the commands (*sub*)."""
    routes = needs_action(sub.add_parser("routes", help="routes"), "routes")
    p = with_config(routes.add_parser("check", help="check partners, schemas and routes"))
    p.set_defaults(func=cmd_routes_check)

    rules = needs_action(sub.add_parser("rules", help="business rules"), "rules")
    p = with_log_level(rules.add_parser("check", help="run a Schematron rule set on documents (no schema validation)"))
    p.add_argument("rules", metavar="RULES.sch", help="the ISO Schematron rule file")
    p.add_argument("documents", metavar="DOC.xml", nargs="+", help="documents to check")
    p.add_argument("--phase", help="the phase to run (default: the schema's defaultPhase, else every pattern)")
    p.add_argument("--json", action="store_true", help="one JSON object per document per line")
    p.add_argument("--cache-dir", help="where compiled rule sets are kept (default: ~/.cache/b2bgw/rules)")
    p.add_argument("--no-cache", action="store_true", help="compile the rule set without the cache")
    p.set_defaults(func=cmd_rules_check)

    key = needs_action(sub.add_parser("key", help="API keys"), "key")
    p = with_config(key.add_parser("new", help="make a new API key and print the hash to configure"))
    p.add_argument("--id", required=True, help="the key id (e.g. acme-2025): the part before the dot")
    p.add_argument("--url", help="the store whose server secret keys the hash (default: the configured store.url)")
    p.set_defaults(func=cmd_key_new)

    operator = sub.add_parser("operator", help="console operators").add_subparsers(
        dest="operator_command", metavar="ACTION"
    )
    p = operator.add_parser("new", help="make an operator's secret and print the hash to configure")
    p.add_argument("--name", required=True, help="the operator's login name")
    p.add_argument(
        "--role",
        choices=["viewer", "operator", "admin"],
        default="viewer",
        help="viewer reads; operator also replays, deletes, moves and purges; admin also manages partners, "
        "keys and certificates (default: viewer)",
    )
    p.set_defaults(func=cmd_operator_new)


def cmd_routes_check(args: argparse.Namespace) -> int:
    from gateway.exchange.assemble import assemble

    settings = settings_for(args)
    assembly = assemble(settings)
    for err in assembly.errors:
        print(f"{err}", file=sys.stderr)
    if assembly.errors:
        to_stderr(f"{len(assembly.errors)} error{'s' if len(assembly.errors) != 1 else ''} in {settings.config_path}")
        return 1
    print(
        f"{settings.config_path}: OK: {len(assembly.partners.partners)} partners, {len(assembly.routes)} routes, "
        f"{len(assembly.registry.names)} schemas"
    )
    for route in assembly.routes:
        who = "every partner" if route.partners is None else ", ".join(sorted(route.partners))
        print(f"  {route.id}: {route.doc_type} from {who} -> {route.destination} ({route.exchange})")
    for name, rule_set in assembly.rules.sets.items():
        compiled = rule_set.compiled
        print(
            f"  rule set {name}: {len(compiled.assertions)} assertions from {compiled.path}"
            f"{' (phase ' + compiled.phase + ')' if compiled.phase else ''}"
        )
    return 0


def cmd_rules_check(args: argparse.Namespace) -> int:
    """Run one Schematron rule set on documents: exit 0 when none fails a rule of flag fatal, error or none,
    1 when one does (or cannot be read), 2 when the rule file cannot be used."""
    from gateway.intake.xmlsafe import parse_document_text
    from gateway.rules.schematron import SaxonRules, SchematronError, default_cache_dir, document_text, load_schematron

    rules = SaxonRules()
    cache = None if args.no_cache else (Path(args.cache_dir) if args.cache_dir else default_cache_dir())
    try:
        compiled = load_schematron(args.rules, args.phase, cache_dir=cache, check=rules)
        rules.add(compiled)
    except SchematronError as exc:
        for err in exc.errors:
            to_stderr(str(err))
        return 2
    except ConfigError as exc:
        to_stderr(str(exc))
        return 2
    rules.lock()
    status = 0
    for name in args.documents:
        try:
            root, decoded = parse_document_text(Path(name).read_bytes())
            findings = rules.run(document_text(root, decoded))
        except OSError as exc:
            to_stderr(f"{name}: {exc.strerror or exc}")
            status = 1
            continue
        except GatewayError as exc:  # not well-formed, a DOCTYPE, too large...
            to_stderr(f"{name}: {exc}")
            status = 1
            continue
        except rules._saxon.PySaxonApiError as exc:
            to_stderr(f"{name}: the rules failed on this document: {' '.join(str(exc).split())[:300]}")
            status = 1
            continue
        failed = [f for f in findings if f.failed_assert]
        reports = [f for f in findings if not f.failed_assert]
        if any(f.is_error for f in findings):
            status = 1
        if args.json:
            print(
                json.dumps(
                    {
                        "document": name,
                        "failed": [f.to_dict() for f in failed],
                        "reports": [f.to_dict() for f in reports],
                    },
                    ensure_ascii=False,
                )
            )
            continue
        errors = sum(1 for f in findings if f.is_error)
        print(
            f"{name}: {'FAILED' if errors else 'ok'} ({errors} error{'s' if errors != 1 else ''}, "
            f"{len(findings) - errors} warning{'s' if len(findings) - errors != 1 else ''} or reports)"
        )
        for f in findings:
            kind = "failed" if f.failed_assert else "report"
            print(f"  {kind} {f.assertion.id or '-'} [{f.assertion.flag or 'no flag'}] {f.location}: {f.text}")
    return status


def cmd_key_new(args: argparse.Namespace) -> int:
    import os

    from gateway.cli.store_secret import store_secret
    from gateway.routing.partners import generate_key
    from gateway.security.keys import hmac_hash

    try:
        key = generate_key(args.id)
    except ValueError as exc:
        raise CommandError(f"{exc}; choose another --id, e.g. acme-2025") from None
    url = args.url or os.environ.get("B2BGW_STORE_URL") or settings_for(args).store_url
    encoded = hmac_hash(store_secret(url), key)
    print(f"API key (give it to the partner; it is not stored anywhere): {key}")
    print(
        f"Add under the partner's 'keys:' in partners.yaml (the hash is keyed by the server secret of "
        f"{shown_url(url)}: gateways serving from that store accept it):"
    )
    print(f"      - id: {args.id}")
    print(f'        hash: "{encoded}"')
    return 0


def cmd_operator_new(args: argparse.Namespace) -> int:
    import re
    import secrets

    from gateway.routing.partners import hash_key

    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$", args.name):
        to_stderr(f"operator name {args.name!r} must be 1-64 letters, digits, '.', '@', '-' or '_'")
        return 2
    secret = secrets.token_urlsafe(24)
    print(f"Secret for {args.name} (give it to the operator; it is not stored anywhere): {secret}")
    print("Add under 'operators:' in the configuration:")
    print(f"  {args.name}:")
    print(f"    role: {args.role}")
    print(f'    hash: "{hash_key(secret)}"')
    return 0
