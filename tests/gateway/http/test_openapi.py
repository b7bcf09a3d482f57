"""The OpenAPI document states what the server enforces: a schema-driven fuzzer (schemathesis) sends the
requests the served ``/openapi.json`` describes, valid ones and invalid ones, to the ASGI app on a gateway
with the sample configuration, and checks every answer against the document: a documented status, media
type, headers and body (each problem's ``code`` among those the document lists for its status); no 5xx
(the in-test responder answers every order); and no request the document calls valid is refused for
a reason it does not state (a header or media type it allows). A stateful run follows the documents' links
from their receipts to their status; and each problem a partner can meet, most of which random requests
never reach (409, 413, 502, 504...), is provoked once and checked against the document too.

Bounded: a fixed number of examples per operation (derandomized), the whole module well under a minute."""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from gwtest import ACME_KEY, GLOBEX_KEY, SAMPLE_CONFIG, Responder, sample_data
from hypothesis import HealthCheck, settings
from schemathesis.checks import CheckContext
from schemathesis.config import SchemathesisConfig

from gateway.config.loader import load_settings, settings_from_mapping
from gateway.errors import GatewayError
from gateway.exchange.assemble import assemble
from gateway.http.app import create_app
from gateway.http.openapi import openapi_document, problem_codes
from gateway.runtime.serving import Runtime

_XML_MEDIA_TYPES = ("application/xml", "text/xml", "application/ubl+xml")


@schemathesis.serializer(*_XML_MEDIA_TYPES)
def _raw_xml(ctx: Any, value: Any) -> bytes:
    """The request body as the document describes it: the XML text itself (schemathesis would wrap a string
    in an element of its own)."""
    if isinstance(value, bytes):
        return value
    return (value if isinstance(value, str) else json.dumps(value)).encode("utf-8")


@pytest.fixture(scope="module")
def gateway_app(tmp_path_factory, gw_registry) -> Iterator[Any]:
    tmp_path = tmp_path_factory.mktemp("openapi")
    settings_ = settings_from_mapping(sample_data(tmp_path), config_path=SAMPLE_CONFIG, base_dir=tmp_path)
    assembly = assemble(settings_, registry=gw_registry)
    assert not assembly.errors
    # schemathesis sends thousands of wrong keys from one address: it checks the document, not the throttle
    # of failed authentications (tests/gateway/security/test_partner_keys.py does)
    assembly.partners.throttle.max_failures = 10**9
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    responder = Responder(runtime.broker).start()
    try:
        yield create_app(assembly, runtime=runtime)
    finally:
        responder.stop()
        runtime.stop()


@pytest.fixture(scope="module")
def client(gateway_app) -> Iterator[Any]:
    """One in-process client (one event loop) for every request of the module."""
    from schemathesis.python import asgi

    with warnings.catch_warnings():  # starlette's TestClient nags about httpx; it works as is
        warnings.simplefilter("ignore")
        _APP.app = gateway_app
        try:
            with asgi.get_client(_APP) as session:
                yield session
        finally:
            _APP.app = None


#: A request the document calls valid may still be refused for the reasons it states about the document
#: itself, which no JSON schema of a text body can express (not well-formed, invalid against its XSD, no
#: route, another partner's route, a taken key, over the size limit); refusals for its shape (headers,
#: media type) are caught by refusals_are_stated.
_STATED_REFUSALS = ["2xx", "400", "401", "403", "404", "409", "413", "422", "429", "502", "503", "504"]


class _Delegate:
    """The ASGI app the schema is bound to when the tests are collected: the module's gateway app, once its
    fixture has made it (the checks send requests of their own, without credentials..., through it too)."""

    app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


_APP = _Delegate()

#: The document the app serves for the sample configuration (test_the_served_document_is_the_configured_one)
DOCUMENT = openapi_document(max_body_bytes=load_settings(SAMPLE_CONFIG).limits.max_bytes)
schema = schemathesis.openapi.from_dict(
    copy.deepcopy(DOCUMENT),  # schemathesis adds to the dict it is given
    config=SchemathesisConfig.from_dict(
        {"checks": {"positive_data_acceptance": {"expected-statuses": _STATED_REFUSALS}}}
    ),
)
schema.app = _APP

#: Problem codes that, answering a request the document calls valid, would mean the document and the server
#: disagree on what a valid request is (the content problems are the document's stated reasons: a body the
#: schema allows may still be not well-formed, invalid against its XSD, or without a route).
_SHAPE_CODES = {"invalid-header", "unsupported-media-type", "method-not-allowed", "not-found", "internal-error"}


@schemathesis.check
def refusals_are_stated(ctx: CheckContext, response: Any, case: Any) -> bool | None:
    """A request the document calls valid is not refused for a reason about its shape."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code < 400:
        return None
    code = response.json().get("code")
    if code == "not-found" and case.path_parameters:  # a message id nobody was given: the stated 404
        return None
    if code in _SHAPE_CODES:
        raise AssertionError(
            f"a request the document calls valid was refused: {response.status_code} {code}: "
            f"{response.json().get('detail')}"
        )
    return None


def _credentials(case: Any) -> str:
    """The partner whose routes take the case's body (the invoice example is Globex's, orders are ACME's)."""
    body = case.body if isinstance(case.body, (str, bytes)) else ""
    body = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    return GLOBEX_KEY if "<Invoice" in body else ACME_KEY


@schema.parametrize()
@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)
def test_the_server_does_what_the_document_says(case: Any, client: Any) -> None:
    headers = {"Authorization": f"Bearer {_credentials(case)}"}
    case.call_and_validate(session=client, headers=headers, additional_checks=[refusals_are_stated])


def test_accepted_documents_followed_through_the_documents_links(client: Any) -> None:
    """Stateful: a document's answer (202 receipt, 200 reply) links to its status, which is then read with the
    credentials it was sent with: the status and reply of real documents match the document too."""
    owners: dict[str, str] = {}  # message id -> the API key that sent it

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            key = owners.get((case.path_parameters or {}).get("message_id", ""), _credentials(case))
            return {"session": client, "headers": {"Authorization": f"Bearer {key}"}}

        def after_call(self, response: Any, case: Any) -> None:
            super().after_call(response, case)
            message_id = response.headers.get("x-message-id")
            if case.method == "POST" and message_id:
                owners[message_id[0] if isinstance(message_id, list) else message_id] = _credentials(case)

        def validate_response(self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any) -> None:
            super().validate_response(response, case, additional_checks=[refusals_are_stated], **kwargs)

    Machine.run(
        settings=settings(
            max_examples=15,
            stateful_step_count=4,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
    )
    assert owners  # documents were accepted and followed


def test_the_served_document_is_the_configured_one(gateway_app) -> None:
    with warnings.catch_warnings():  # starlette's TestClient nags about httpx; it works as is
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

        served = TestClient(gateway_app).get("/openapi.json").json()
    limit = gateway_app.state.assembly.settings.limits.max_bytes
    assert openapi_document(max_body_bytes=limit) == DOCUMENT
    # the partner API's part of it (the operators' side, when configured, adds its own paths: test_admin_api.py)
    assert {path: v for path, v in served["paths"].items() if not path.startswith("/admin/")} == DOCUMENT["paths"]
    assert {k: v for k, v in served.items() if k not in ("paths", "components", "tags")} == {
        k: v for k, v in DOCUMENT.items() if k not in ("paths", "components", "tags")
    }
    for name, schema in DOCUMENT["components"]["schemas"].items():
        if name != "Problem":  # whose code list the operators' side extends
            assert served["components"]["schemas"][name] == schema
    assert f"at most {limit} bytes" in served["paths"]["/v1/documents"]["post"]["description"]


def test_every_problem_code_a_post_can_carry_is_listed_under_its_status() -> None:
    """The codes come from gateway.errors: each error class a request can meet is listed under its status."""
    document = openapi_document()
    responses = document["paths"]["/v1/documents"]["post"]["responses"]

    def listed(status: int) -> list[str]:
        return responses[str(status)]["content"]["application/problem+json"]["schema"]["allOf"][1]["properties"][
            "code"
        ]["enum"]

    assert {"not-well-formed", "forbidden-xml", "schema-invalid", "invalid-header"} <= set(listed(400))
    assert listed(409) == ["archived-replay", "idempotency-conflict"] and listed(415) == ["unsupported-media-type"]
    assert listed(413) == ["document-too-large"] and listed(422) == ["no-route", "rules-error", "rules-timeout"]
    assert listed(502) == ["backend-error"] and listed(504) == ["reply-timeout"]
    assert "500" not in responses and "404" not in responses
    for status in (400, 401, 403, 409, 413, 415, 422, 502, 503, 504):
        assert listed(status) == problem_codes(status)

    class LimitError(GatewayError):  # a status the POST may answer, with a code added later
        status = 429
        code = "test-rate-limited"

    try:
        later = openapi_document()["paths"]["/v1/documents"]["post"]["responses"]
        assert (
            "test-rate-limited"
            in later["429"]["content"]["application/problem+json"]["schema"]["allOf"][1]["properties"]["code"]["enum"]
        )
    finally:
        del LimitError
        import gc

        gc.collect()  # __subclasses__ holds the class weakly
    assert "test-rate-limited" not in json.dumps(openapi_document())


def _documented(document: dict[str, Any], path: str, method: str, response: Any) -> None:
    """*response* is one the document gives for the operation: its status, media type and required headers,
    and its body valid against the documented schema (schemathesis's validation of a response)."""
    operation = document["paths"][path][method]
    status = str(response.status_code)
    assert status in operation["responses"], (path, method, status, response.text)
    spec = operation["responses"][status]
    for name, header in spec.get("headers", {}).items():
        assert not header["required"] or name.lower() in response.headers, (status, name)
    assert any(response.headers["content-type"].startswith(m) for m in spec["content"]), response.headers
    schema[path][method.upper()].validate_response(response)


def test_every_problem_the_server_gives_is_the_one_the_document_states(gw_sync) -> None:
    """Provoke each status a partner can meet (the fuzzer reaches few of them by chance) and check each answer
    against the document."""
    from gwtest import ACME, DESPATCH_ADVICE, GLOBEX, INVOICE, ORDER, with_id

    client, runtime, responder = gw_sync
    document = client.get("/openapi.json").json()
    limit = runtime.assembly.settings.limits.max_bytes

    def post(body: bytes, headers: dict[str, str], expected: int, code: str | None = None) -> Any:
        response = client.post("/v1/documents", content=body, headers=headers)
        assert response.status_code == expected, response.text
        _documented(document, "/v1/documents", "post", response)
        if code is not None:
            assert response.json()["code"] == code
        return response

    first = post(with_id(INVOICE, "OA-1"), {**GLOBEX, "Idempotency-Key": "oa key 1"}, 202)
    post(with_id(INVOICE, "OA-1"), {**GLOBEX, "Idempotency-Key": "oa key 1"}, 202)  # the replay
    conflict = post(with_id(INVOICE, "OA-2"), {**GLOBEX, "Idempotency-Key": "oa key 1"}, 409, "idempotency-conflict")
    assert conflict.json()["message_id"] == first.json()["message_id"]
    post(b"<Invoice", GLOBEX, 400, "not-well-formed")
    post(b"<!DOCTYPE a [<!ENTITY e 'x'>]><a>&e;</a>", GLOBEX, 400, "forbidden-xml")
    post(INVOICE.replace(b"<cbc:IssueDate>2009-12-15", b"<cbc:IssueDate>soon"), GLOBEX, 400, "schema-invalid")
    post(INVOICE, {**GLOBEX, "X-Correlation-ID": "a b"}, 400, "invalid-header")
    post(INVOICE, {"Content-Type": "application/xml"}, 401, "unauthenticated")
    post(INVOICE, ACME, 403, "forbidden-route")
    post(b"<a/>", {**GLOBEX, "Content-Length": str(limit + 1)}, 413, "document-too-large")
    post(INVOICE, {**GLOBEX, "Content-Type": "text/plain"}, 415, "unsupported-media-type")
    post(b"<a/>", GLOBEX, 422, "no-route")
    post(DESPATCH_ADVICE, {**GLOBEX, "Content-Type": "application/ubl+xml; charset=utf-8"}, 202)
    assert post(with_id(ORDER, "OA-3"), ACME, 200).headers["content-location"]
    responder.mode = "error"
    post(with_id(ORDER, "OA-4"), ACME, 502, "backend-error")
    responder.mode = "silent"
    timed_out = post(with_id(ORDER, "OA-5"), ACME, 504, "reply-timeout")

    status_url = first.json()["status_url"]
    for path, url, headers, expected in [
        ("/v1/documents/{message_id}", status_url, GLOBEX, 200),
        ("/v1/documents/{message_id}", status_url, ACME, 404),  # another partner's: not found
        ("/v1/documents/{message_id}", status_url, {}, 401),
        ("/v1/documents/{message_id}/reply", status_url + "/reply", GLOBEX, 404),  # no reply on a one-way route
        ("/v1/documents/{message_id}", timed_out.json()["status_url"], ACME, 200),
    ]:
        response = client.get(url, headers=headers)
        assert response.status_code == expected, (url, response.text)
        _documented(document, path, "get", response)
    replied = client.get(
        "/v1/documents/" + post(with_id(ORDER, "OA-6"), ACME, 504).json()["message_id"] + "/reply", headers=ACME
    )
    _documented(document, "/v1/documents/{message_id}/reply", "get", replied)
    for path in ("/healthz", "/readyz"):
        _documented(document, path, "get", client.get(path))
    runtime.gateway.stop()  # stopping: nothing is accepted
    post(INVOICE, GLOBEX, 503, "store-unavailable")
    _documented(document, "/readyz", "get", client.get("/readyz"))
    _documented(document, "/v1/documents/{message_id}", "get", client.get(status_url, headers=GLOBEX))
