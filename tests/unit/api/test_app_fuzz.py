"""Hostile input against the aiohttp app, property-based (hypothesis, bounded examples).

The agent behind the app is a real `OvnWorker` (fake host and haproxy), so an
accepted body really is allocated, persisted and reconciled. Properties: no
answer is a 5xx; every error is the JSON error shape; a 400 about the body
lists details whose paths point into the body; a rejected body never reaches
the agent and changes nothing; generations are accepted in order only (409).
"""

import asyncio
import copy
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbagent.api.app import create_app
from lbagent.state import StateStore
from lbagent.workers.ovn_worker import OvnWorker
from tests.unit.fakes import FakeAgent, FakeHaproxy, FakeHost
from tests.unit.samples import AUTH, EXAMPLE, TOKEN

EXAMPLES = 300
# database=None: no example database left in the work tree.
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=16,
)


class FuzzAgent(FakeAgent):
    """The fake agent of test_api, refreshing a real supervisor and recording what reached it."""

    def __init__(self, worker: OvnWorker):
        super().__init__()
        self.real = worker
        self.offered = []

    async def refresh(self, desired, raw, raw_text=None):
        self.offered.append(desired.generation)
        return await self.real.apply(desired, raw, raw_text)


class App:
    """One event loop and one app for a whole hypothesis run (fixtures are per test, not per example)."""

    def __init__(self, tmp_path):
        self.loop = asyncio.new_event_loop()
        self.store = StateStore(tmp_path)
        self.worker = OvnWorker(FakeHost(), FakeHaproxy(), self.store, resync_interval=3600)
        self.agent = FuzzAgent(self.worker)
        self.client = self.run(self._client())

    async def _client(self) -> TestClient:
        client = TestClient(TestServer(create_app(self.agent, TOKEN, max_body_bytes=256 * 1024, reporter=self.agent)))
        await client.start_server()
        return client

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    async def send(self, method, path, data=None, headers=None):
        resp = await self.client.request(method, path, data=data, headers=headers or {})
        raw = await resp.read()
        return resp.status, resp.content_type, raw

    def close(self):
        self.run(self.worker.stop())
        self.run(self.client.close())
        self.loop.close()


@pytest.fixture
def app(tmp_path):
    app = App(tmp_path)
    yield app
    app.close()


# --- mutations of the valid example ------------------------------------------------


def walk(node, at=()):
    yield at
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, (*at, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, (*at, index))


def resolve(body, path):
    for part in path:
        body = body[part]
    return body


@st.composite
def mutated_example(draw):
    body = copy.deepcopy(EXAMPLE)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from([p for p in walk(body) if p]))
        parent, key = resolve(body, path[:-1]), path[-1]
        action = draw(st.sampled_from(["replace", "replace", "delete", "unknown", "duplicate", "number"]))
        if action == "replace":
            parent[key] = draw(JSON)
        elif action == "delete":
            del parent[key]
        elif action == "unknown" and isinstance(parent[key], dict):
            parent[key][draw(st.text(min_size=1, max_size=8))] = draw(JSON)
        elif action == "duplicate" and isinstance(parent[key], list) and parent[key]:
            parent[key].append(copy.deepcopy(parent[key][0]))
        else:
            parent[key] = draw(st.sampled_from([0, -1, 1, 65535, 65536, 2**63, 1.5, True, "", "x" * 300]))
    return body


def pointer_parts(pointer: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]] if pointer else []


def parent_exists(body, pointer: str) -> bool:
    node = body
    for part in pointer_parts(pointer)[:-1]:
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return False
    return True


def check_error_shape(status: int, raw: bytes) -> dict:
    answer = json.loads(raw)
    assert set(answer) == {"error", "message", "details"}, answer
    assert isinstance(answer["error"], str) and isinstance(answer["message"], str)
    assert all(set(d) == {"path", "message"} for d in answer["details"]), answer
    return answer


def persisted_desired(app: App):
    # Only the accepted body: allocations may change meanwhile, as load
    # balancers of an earlier state finish their teardown in the background.
    return app.store.load().desired


def post_body(app: App, body) -> None:
    """Post one body and check every property of the answer."""
    before = (app.worker.desired, list(app.agent.offered), persisted_desired(app))
    current = app.worker.generation
    status, _, raw = app.run(
        app.send("POST", "/v1/refresh", json.dumps(body).encode(), {**AUTH, "Content-Type": "application/json"})
    )
    assert status < 500, raw
    if status == 202:
        assert json.loads(raw) == {"generation": body["generation"]}
        assert app.worker.desired.generation == body["generation"]
        assert current is None or body["generation"] >= current
        return
    answer = check_error_shape(status, raw)
    assert app.worker.desired is before[0], "a rejected body changed the desired state"
    assert persisted_desired(app) == before[2], "a rejected body was persisted"
    if status == 409:  # generation order is the agent's to judge: this one did reach it
        assert answer["error"] == "stale_generation" and body["generation"] < current
        return
    assert app.agent.offered == before[1], "an invalid body reached the agent"
    assert status == 400 and answer["error"] == "invalid_body", answer
    assert answer["details"], answer
    for detail in answer["details"]:
        assert detail["path"] == "" or detail["path"].startswith("/"), detail
        assert parent_exists(body, detail["path"]), (detail, body)


def test_mutated_example_bodies(app):
    @FUZZ
    @given(body=mutated_example())
    def check(body):
        post_body(app, body)

    check()


def test_arbitrary_json_bodies(app):
    @FUZZ
    @given(body=JSON | st.fixed_dictionaries({"generation": st.integers(0, 10)}, optional={"x": JSON}))
    def check(body):
        post_body(app, body)

    check()


def test_generations_are_accepted_in_order_only(app):
    @settings(max_examples=50, deadline=None, database=None)
    @given(generations=st.lists(st.integers(0, 2**31), min_size=1, max_size=8))
    def check(generations):
        for generation in generations:
            current = app.worker.generation
            body = {**EXAMPLE, "generation": generation}
            status, _, _ = app.run(
                app.send("POST", "/v1/refresh", json.dumps(body).encode(), {**AUTH, "Content-Type": "application/json"})
            )
            expected = 409 if current is not None and generation < current else 202
            assert status == expected, (generation, current)

    check()


PATHS = [
    "/v1/refresh",
    "/v1/status",
    "/v1/loadbalancers/known",
    "/v1/loadbalancers/x",
    "/healthz",
    "/readyz",
    "/metrics",
    "/v1/openapi.json",
    "/",
    "/v1",
    "/v1/loadbalancers/",
]


def test_arbitrary_requests_to_every_endpoint(app):
    @FUZZ
    @given(
        method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
        path=st.sampled_from(PATHS)
        | st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=30).map(
            lambda s: "/v1/" + s.replace("?", "").replace("#", "").lstrip("/")
        ),
        query=st.sampled_from(["", "?wait=0", "?wait=-1", "?wait=abc", "?wait=1e400", "?x=%ff"]),
        token=st.sampled_from([TOKEN, "", "wrong", TOKEN + "x", f" {TOKEN} "])
        | st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
        scheme=st.sampled_from(["Bearer", "bearer", "Basic", ""]),
        content_type=st.sampled_from(["application/json", "text/plain", "", "application/json; charset=utf-8"]),
        data=st.binary(max_size=64) | JSON.map(lambda v: json.dumps(v).encode()),
    )
    def check(method, path, query, token, scheme, content_type, data):
        offered = list(app.agent.offered)
        headers = {"Authorization": f"{scheme} {token}"}
        if content_type:
            headers["Content-Type"] = content_type
        status, ctype, raw = app.run(app.send(method, path + query, data if method != "GET" else None, headers))
        if path == "/readyz" and status == 503:  # not ready is an answer, not a failure
            assert json.loads(raw)["ready"] is False
            return
        assert status < 500, (status, raw)
        if status >= 400 and method != "HEAD":
            assert ctype == "application/json"
            check_error_shape(status, raw)
        if not (scheme.lower() == "bearer" and token.strip() == TOKEN) or status not in (202, 409):
            assert app.agent.offered == offered

    check()
