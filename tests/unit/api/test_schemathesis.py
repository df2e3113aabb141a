"""The served OpenAPI document against the app, fuzzed by schemathesis.

schemathesis reads GET /v1/openapi.json as a client would and generates
POST /v1/refresh requests from it; they go over a real socket to the aiohttp
app (aiohttp TestServer on a loop in a thread) whose agent is a real
`OvnWorker` with a fake host and haproxy.

Positive cases (bodies the document calls valid): the answer is never a 5xx
other than the documented 504 of `?wait`, it conforms to the document
(status code, content type, schema), and it is 202/200 (accepted), or 409
(valid, but a generation lower than one already accepted), or a 400 whose
every detail is a cross-field problem.

The rule for those 400s: JSON Schema cannot say that a reference names an
existing object, that ids or ports are unique, or that an address lies inside
its subnet, and the document says so in its descriptions. A 400 is tolerated
when every one of its details' messages is one of those documented kinds
(`CROSS_FIELD` in schemarules.py, matched on the message's start), or an integer
written with a fraction (1.0), which JSON Schema counts as an integer and the
agent refuses, as the document says; one detail about
anything else (a pattern, a length, a type, an unknown field) means the
document called a body valid that the validation refuses, and fails the test.

Negative cases (bodies the document calls invalid) must never be accepted.
"""

import asyncio
import json
import threading

import pytest
import requests
import schemathesis
from hypothesis import given
from schemathesis import GenerationMode
from schemathesis.core.parameters import ParameterLocation

from lbagent.api.app import create_app
from lbagent.state import StateStore
from lbagent.workers.ovn_worker import OvnWorker
from tests.unit.api.schemarules import CHECKS, FUZZ, not_cross_field
from tests.unit.fakes import FakeAgent, FakeHaproxy, FakeHost
from tests.unit.samples import AUTH, TOKEN


class Agent(FakeAgent):
    def __init__(self, worker: OvnWorker):
        super().__init__()
        self.real = worker

    async def refresh(self, desired, raw, raw_text=None):
        return await self.real.apply(desired, raw, raw_text)

    async def wait_settled(self, generation, timeout):
        return await self.real.wait_settled(generation, min(timeout, 2.0))


class Server:
    """The app on a real socket, its event loop in a thread of its own (requests is synchronous)."""

    def __init__(self, tmp_path):
        from aiohttp.test_utils import TestServer

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.worker = OvnWorker(FakeHost(), FakeHaproxy(), StateStore(tmp_path), resync_interval=3600)
        agent = Agent(self.worker)
        self.server = TestServer(create_app(agent, TOKEN, max_body_bytes=4 * 1024 * 1024, reporter=agent))
        self.run(self.server.start_server())
        self.url = str(self.server.make_url(""))
        self.session = requests.Session()

    def run(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.session.close()
        self.run(self.worker.stop())
        self.run(self.server.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("schemathesis"))
    yield server
    server.close()


@pytest.fixture(scope="module")
def schema(server):
    # The document as served, the way a generated client or a fuzzer gets it.
    served = server.session.get(server.url + "/v1/openapi.json", timeout=10).json()
    return schemathesis.openapi.from_dict(served)


def send(server, case):
    case.headers = {**(case.headers or {}), **AUTH}
    response = case.call(base_url=server.url, session=server.session, timeout=30)
    case.validate_response(response, checks=CHECKS)
    return response


def test_bodies_the_document_calls_valid_are_accepted(server, schema):
    operation = schema["/v1/refresh"]["POST"]

    @FUZZ
    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    def check(case):
        response = send(server, case)
        status = response.status_code
        waited = case.query is not None and "wait" in case.query
        assert status < 500 or (status == 504 and waited), (status, response.text)
        if status == 400:
            answer = response.json()
            refused = not_cross_field(answer)
            assert not refused, (
                f"the document calls this body valid, the agent refuses it: {refused}\n" + json.dumps(case.body)[:4000]
            )
        else:
            assert status in (200, 202, 409, 504), (status, response.text)

    check()


def test_bodies_the_document_calls_invalid_are_refused(server, schema):
    operation = schema["/v1/refresh"]["POST"]

    @FUZZ
    @given(case=operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    def check(case):
        response = send(server, case)
        assert response.status_code < 500, (response.status_code, response.text)
        # schemathesis also negates the query (unknown parameters, which the
        # app ignores) and the headers (the token, which `send` sets): only a
        # negated body must be refused.
        if case.meta.components[ParameterLocation.BODY].mode is GenerationMode.NEGATIVE:
            assert response.status_code == 400, json.dumps(case.body)[:4000]

    check()
