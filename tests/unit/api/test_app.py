"""The HTTP layer alone, with a fake agent: status codes, error bodies, auth, metrics."""

import json

import pytest

from lbagent.api.app import _utf8_text
from tests.unit.samples import AUTH, EXAMPLE, TOKEN


async def test_refresh_accepts_and_returns_generation(client):
    resp = await client.post("/v1/refresh", json=EXAMPLE, headers=AUTH)
    assert resp.status == 202 and await resp.json() == {"generation": 7}
    resp = await client.post("/v1/refresh?wait=5", json={**EXAMPLE, "generation": 8}, headers=AUTH)
    assert resp.status == 200 and (await resp.json())["generation"] == 8
    client.agent.worker.settle = False
    resp = await client.post("/v1/refresh?wait=0.1", json={**EXAMPLE, "generation": 9}, headers=AUTH)
    assert resp.status == 504


async def test_auth(client):
    assert (await client.get("/v1/status")).status == 401
    assert (await client.get("/v1/status", headers={"Authorization": "Bearer nope"})).status == 401
    assert (await client.get("/v1/status", headers={"Authorization": "Basic " + TOKEN})).status == 401
    resp = await client.get("/v1/status", headers=AUTH)
    assert resp.status == 200
    assert (await client.get("/healthz")).status == 200  # probes need no token
    assert (await client.get("/metrics", headers=AUTH)).status == 200


@pytest.mark.parametrize(
    "body, content_type, status, code",
    [
        (b"{", "application/json", 400, "invalid_json"),
        (b"{}", "text/plain", 415, "unsupported_media_type"),
        (b'{"generation": 1, "bogus": 2}', "application/json", 400, "invalid_body"),
        (b"x" * (65 * 1024), "application/json", 413, "body_too_large"),
    ],
)
async def test_bad_requests_are_json_errors(client, body, content_type, status, code):
    resp = await client.post("/v1/refresh", data=body, headers={**AUTH, "Content-Type": content_type})
    assert resp.status == status
    answer = await resp.json()
    assert answer["error"] == code and "message" in answer and isinstance(answer["details"], list)
    assert client.agent.accepted == []


async def test_invalid_body_lists_paths(client):
    body = json.loads(json.dumps(EXAMPLE))
    body["loadbalancers"][0]["listeners"][0]["listener_port"] = 0
    body["loadbalancers"][0]["id"] = "a b"
    resp = await client.post("/v1/refresh", json=body, headers=AUTH)
    paths = {d["path"] for d in (await resp.json())["details"]}
    assert resp.status == 400
    assert {"/loadbalancers/0/listeners/0/listener_port", "/loadbalancers/0/id"} <= paths


async def test_stale_generation_conflicts(client):
    assert (await client.post("/v1/refresh", json=EXAMPLE, headers=AUTH)).status == 202
    resp = await client.post("/v1/refresh", json={**EXAMPLE, "generation": 3}, headers=AUTH)
    assert resp.status == 409 and (await resp.json())["error"] == "stale_generation"


async def test_bad_wait_parameter(client):
    resp = await client.post("/v1/refresh?wait=soon", json=EXAMPLE, headers=AUTH)
    assert resp.status == 400 and client.agent.accepted == []


async def test_loadbalancer_and_readiness(client):
    assert (await client.get("/v1/loadbalancers/known", headers=AUTH)).status == 200
    resp = await client.get("/v1/loadbalancers/unknown", headers=AUTH)
    assert resp.status == 404 and (await resp.json())["error"] == "not_found"
    resp = await client.get("/readyz")
    assert resp.status == 503 and "desired state" in (await resp.json())["reason"]
    client.agent.ready_reason = None
    assert (await client.get("/readyz")).status == 200
    assert (await client.get("/nowhere", headers=AUTH)).status == 404


async def test_errors_are_json_everywhere(client):
    resp = await client.get("/v1/refresh", headers=AUTH)
    assert resp.status == 405 and (await resp.json())["error"] == "method_not_allowed"
    resp = await client.head("/v1/status", headers=AUTH)  # no implicit HEAD routes
    assert resp.status == 405

    async def broken():
        raise OSError("disk full")

    client.agent.status = broken
    resp = await client.get("/v1/status", headers=AUTH)
    assert resp.status == 500
    assert await resp.json() == {
        "error": "internal_error",
        "message": "the agent failed to answer; see its log",
        "details": [],
    }


@pytest.mark.parametrize(
    "body, path",
    [
        (b"{", ""),
        (b"[" * 50_000, ""),  # deeper than the JSON decoder recurses
        (b"\xff\xfe{}", ""),
    ],
)
async def test_undecodable_bodies_are_400_with_a_detail(client, body, path):
    resp = await client.post("/v1/refresh", data=body, headers={**AUTH, "Content-Type": "application/json"})
    answer = await resp.json()
    assert resp.status == 400 and answer["error"] == "invalid_json"
    assert [d["path"] for d in answer["details"]] == [path]
    assert client.agent.accepted == []


@pytest.mark.parametrize("wait", ["soon", "-1", "nan", "inf"])
async def test_bad_wait_names_the_parameter(client, wait):
    resp = await client.post(f"/v1/refresh?wait={wait}", json=EXAMPLE, headers=AUTH)
    answer = await resp.json()
    assert resp.status == 400 and answer["error"] == "invalid_parameter"
    assert answer["details"][0]["path"] == "?wait"
    assert client.agent.accepted == []


async def test_openapi_needs_no_token(client):
    from lbagent.api.openapi import document

    resp = await client.get("/v1/openapi.json")
    assert resp.status == 200 and resp.content_type == "application/json"
    assert await resp.json() == document()


async def test_the_body_text_to_persist_is_utf8_only(client):
    body = json.dumps({**EXAMPLE, "generation": 20}, ensure_ascii=False)
    utf8 = await client.post("/v1/refresh", data=body.encode(), headers={**AUTH, "Content-Type": "application/json"})
    utf16 = await client.post(
        "/v1/refresh",
        data=json.dumps({**EXAMPLE, "generation": 21}).encode("utf-16"),
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert [utf8.status, utf16.status] == [202, 202]
    assert client.agent.texts == [body, None]
    # An encoded surrogate: json.loads takes it, UTF-8 does not (validation refuses it
    # in every field today; the text is not persisted verbatim either way).
    assert _utf8_text(b'{"name": "\xed\xa0\x80"}') is None
    assert _utf8_text('{"name": "caf\u00e9"}'.encode()) == '{"name": "caf\u00e9"}'
