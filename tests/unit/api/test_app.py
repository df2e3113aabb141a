"""The HTTP layer alone, with a fake agent: status codes, error bodies, auth, metrics."""

import asyncio
import copy
import gzip
import json
import threading

import pytest
from aiohttp.test_utils import TestClient, TestServer

from lbagent.api.app import PARSER, PARSING, _utf8_text, create_app
from lbagent.api.server import runner_options
from lbagent.desired.model import parse_desired_state
from tests.unit.fakes import FakeAgent
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


# --- hostile bodies ----------------------------------------------------------------


class BlockingParser:
    """A parser whose parse blocks its thread until released, and which counts
    how many parses run at once."""

    def __init__(self):
        self.release = threading.Event()
        self.entered = threading.Event()
        self.finished = threading.Event()
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    def parse(self, body, comparable=True):
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.entered.set()
        # Bounded: on the event loop this blocks it, and the test fails instead of hanging.
        self.release.wait(timeout=5)
        with self._lock:
            self.running -= 1
        self.finished.set()
        return parse_desired_state(body)


@pytest.fixture
async def slow_client():
    agent = FakeAgent()
    app = create_app(agent, TOKEN, max_body_bytes=64 * 1024, reporter=agent)
    app[PARSER] = parser = BlockingParser()
    client = TestClient(TestServer(app))
    await client.start_server()
    client.agent, client.parser = agent, parser
    yield client
    parser.release.set()
    await client.close()


async def test_healthz_answers_while_a_body_is_parsed(slow_client):
    parser = slow_client.parser
    posting = asyncio.create_task(slow_client.post("/v1/refresh", json=EXAMPLE, headers=AUTH))
    assert await asyncio.to_thread(parser.entered.wait, 10)
    health = await slow_client.get("/healthz")
    # Answered before the parse was let go: the parse does not hold the event loop.
    assert health.status == 200 and not parser.finished.is_set()
    parser.release.set()
    assert (await posting).status == 202


async def test_two_bodies_are_never_parsed_at_once(slow_client, monkeypatch):
    parser, pool = slow_client.parser, slow_client.app[PARSING]
    submitted: asyncio.Queue = asyncio.Queue()
    run = pool.run

    async def counted_run(*args):
        submitted.put_nowait(None)
        return await run(*args)

    monkeypatch.setattr(pool, "run", counted_run)
    first = asyncio.create_task(slow_client.post("/v1/refresh", json=EXAMPLE, headers=AUTH))
    second = asyncio.create_task(slow_client.post("/v1/refresh", json={**EXAMPLE, "generation": 8}, headers=AUTH))
    for _ in range(2):
        await asyncio.wait_for(submitted.get(), 10)
    assert await asyncio.to_thread(parser.entered.wait, 10)
    parser.release.set()
    assert sorted([(await first).status, (await second).status]) == [202, 202]
    assert parser.most_at_once == 1


@pytest.fixture
async def served():
    """A client of the application served as `lbagent run` serves it, with the default body limit."""
    agent = FakeAgent()
    app = create_app(agent, TOKEN, max_body_bytes=16 * 1024 * 1024, reporter=agent)
    server = TestServer(app)
    await server.start_server(**runner_options())
    client = TestClient(server)
    await client.start_server()
    client.agent = agent
    yield client
    await client.close()


async def test_a_body_of_many_unknown_fields_gets_a_short_answer(served):
    body = json.dumps({"generation": 1, **{f"generatoin{i}": 1 for i in range(200_000)}}).encode()
    resp = await served.post("/v1/refresh", data=body, headers={**AUTH, "Content-Type": "application/json"})
    answer = await resp.read()
    assert resp.status == 400 and json.loads(answer)["error"] == "invalid_body"
    details = json.loads(answer)["details"]
    assert len(details) == 101 and len(answer) < 16 * 1024
    assert details[0] == {"path": "/generatoin0", "message": "unknown field; did you mean 'generation'?"}
    assert details[-1] == {"path": "", "message": "199900 more problems are not listed"}
    assert served.agent.accepted == []


@pytest.mark.parametrize(
    "text, paths",
    [
        ('{"generation": 1, "generation": 2}', ["/generation"]),
        ('{"generation": 1, "subnets": [{"id": "a", "id": "b"}]}', ["/subnets/0/id"]),
    ],
)
async def test_a_key_given_twice_is_invalid_json_at_its_path(client, text, paths):
    resp = await client.post("/v1/refresh", data=text, headers={**AUTH, "Content-Type": "application/json"})
    answer = await resp.json()
    assert resp.status == 400 and answer["error"] == "invalid_json"
    assert [d["path"] for d in answer["details"]] == paths
    assert answer["details"][0]["message"] == "key given more than once in its object"
    assert (
        answer["message"]
        == f"the body is not JSON the agent accepts: {len(paths)} key(s) given more than once in their object"
    )
    assert client.agent.accepted == []


async def test_a_body_over_the_server_budget_is_refused_at_its_load_balancer(client):
    lb = copy.deepcopy(EXAMPLE["loadbalancers"][0])
    lb["listeners"] = [
        {
            "id": "lsn-1",
            "listener_type": "http",
            "listener_port": 80,
            "backend_group_id": "bg-1",
            # Every rule is a haproxy backend of its own, with every member of its group.
            "rules": [{"id": f"r{k}", "path": f"/p{k}", "backend_group_id": "bg-1"} for k in range(16)],
        }
    ]
    lb["backend_groups"] = [
        {"id": "bg-1", "backends": [{"id": f"be-{k}", "address": "198.18.0.21", "port": 1000 + k} for k in range(256)]}
    ]
    resp = await client.post("/v1/refresh", json={**EXAMPLE, "loadbalancers": [lb]}, headers=AUTH)
    answer = await resp.json()
    assert resp.status == 400 and answer["error"] == "invalid_body"
    assert [d["path"] for d in answer["details"]] == ["/loadbalancers/0"]
    assert "needs 4352 haproxy servers, more than the 4096" in answer["details"][0]["message"]
    assert client.agent.accepted == []


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "identity, gzip", "x-anything"])
async def test_a_compressed_body_is_refused_unread(served, encoding):
    body = gzip.compress(json.dumps(EXAMPLE).encode())
    headers = {**AUTH, "Content-Type": "application/json", "Content-Encoding": encoding}
    resp = await served.post("/v1/refresh", data=body, headers=headers)
    answer = await resp.json()
    assert resp.status == 415 and answer["error"] == "unsupported_media_type"
    assert "encodings are not accepted" in answer["message"]
    assert served.agent.accepted == []


async def test_an_identity_encoding_is_no_encoding(client):
    headers = {**AUTH, "Content-Type": "application/json", "Content-Encoding": "identity"}
    assert (await client.post("/v1/refresh", data=json.dumps(EXAMPLE), headers=headers)).status == 202


async def raw_request(client, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()


@pytest.mark.parametrize("token", [b"tok\xff\xfeen", b"t\xc3\xa9st", TOKEN.encode() + b"\xc3\xa9", b"\xed\xa0\x80"])
async def test_a_token_that_is_not_ascii_is_unauthorized(client, token):
    head = await raw_request(
        client, b"GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + b"\r\n\r\n"
    )
    assert head.startswith(b"HTTP/1.1 401 ")
