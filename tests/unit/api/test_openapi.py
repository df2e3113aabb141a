"""The OpenAPI document: valid OpenAPI 3.1, equal to the routes the app serves,
and its schemas agree with what the app and the validators really do."""

import copy

import pytest
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from lbagent.api import app as api
from lbagent.api.app import create_app
from lbagent.api.openapi import document, open_paths
from lbagent.desired.model import parse_desired_state
from lbagent.errors import InvalidDesiredState
from lbagent.workers.dispatch import kind_of
from lbagent.workers.pods import PodController
from lbagent.workers.queue import WorkQueue
from lbagent.workers.subnets import SubnetController
from tests.unit.fakes import FakeAgent
from tests.unit.samples import AUTH, EXAMPLE

METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def answer_validator(schema: str) -> OAS31Validator:
    doc = document()
    return OAS31Validator({"$ref": f"#/components/schemas/{schema}", "components": doc["components"]})


def test_document_is_valid_openapi():
    validate(document())


def test_every_route_is_documented_and_every_documented_operation_is_served():
    app = create_app(agent := FakeAgent(), "t0ken-t0ken", max_body_bytes=1024, reporter=agent)
    served = {(route.method.lower(), route.resource.canonical) for route in app.router.routes()}
    documented = {
        (method, path) for path, operations in document()["paths"].items() for method in operations if method in METHODS
    }
    assert served == documented


def test_the_documented_open_paths_are_the_ones_the_app_leaves_open():
    assert api.OPEN_PATHS == open_paths() == {"/healthz", "/readyz", "/v1/openapi.json"}


async def test_unauthenticated_requests_get_what_the_document_says(client):
    for path, operations in document()["paths"].items():
        for method, operation in operations.items():
            url = path.replace("{lb_id}", "known")
            resp = await client.request(method.upper(), url, json={} if method == "post" else None)
            if operation.get("security") == []:
                assert resp.status != 401, (method, path)
            else:
                assert resp.status == 401 and "401" in operation["responses"], (method, path)
                answer_validator("Error").validate(await resp.json())


def test_the_example_body_matches_the_request_schema():
    validator = answer_validator("DesiredState")
    validator.validate(EXAMPLE)
    parse_desired_state(EXAMPLE)


@pytest.mark.parametrize(
    "breaks",
    [
        lambda body: body.pop("generation"),
        lambda body: body.update(bogus=1),
        lambda body: body["loadbalancers"][0]["listeners"][0].update(listener_port=0),
        lambda body: body["loadbalancers"][0]["network"].update(mac=7),
        # What fields.py checks in Python, spelled out in the schema as patterns:
        lambda body: body["loadbalancers"][0]["network"].update(ip="0.0.0.0"),
        lambda body: body["loadbalancers"][0]["network"].update(ip="127.0.0.1"),
        lambda body: body["loadbalancers"][0]["network"].update(ip="198.018.0.12"),
        lambda body: body["loadbalancers"][0]["network"].update(mac="00:00:00:00:00:00"),
        lambda body: body["loadbalancers"][0]["network"].update(mac="01:22:0a:00:00:12"),
        lambda body: body["subnets"][0].update(cidr="198.18.0.1/24"),
        lambda body: body["loadbalancers"][0].update(name="two\nlines"),
        lambda body: body["pods"].append({"id": "p", "namespace": "n", "ip": "198.18.0.50", "labels": {"b@d": "x"}}),
        lambda body: body["loadbalancers"][0]["listeners"][0].update(
            health_check={"type": "http", "http_code": "http_2xx,http_2xx"}
        ),
        # Rules inside one object (model validators and per-listener checks):
        lambda body: body["loadbalancers"][0]["listeners"][0].update(redirect={"code": 301}),
        lambda body: body["loadbalancers"][0]["listeners"][0].update(listener_type="tcp", gzip=True),
        lambda body: body["loadbalancers"][0]["listeners"][0].update(listener_type="https"),
    ],
)
def test_the_request_schema_refuses_what_the_validator_refuses(breaks):
    body = copy.deepcopy(EXAMPLE)
    breaks(body)
    assert not answer_validator("DesiredState").is_valid(body)
    with pytest.raises(InvalidDesiredState):
        parse_desired_state(body)


async def test_real_answers_match_their_schemas(client):
    resp = await client.post("/v1/refresh", json=EXAMPLE, headers=AUTH)
    answer_validator("Accepted").validate(await resp.json())
    resp = await client.post("/v1/refresh", json={"generation": 1, "bogus": 1}, headers=AUTH)
    answer_validator("Error").validate(await resp.json())
    resp = await client.get("/healthz")
    answer_validator("Health").validate(await resp.json())
    resp = await client.get("/readyz")
    assert resp.status == 503
    answer_validator("Readiness").validate(await resp.json())


async def test_the_controllers_status_sections_match_the_status_schema():
    queue = WorkQueue("t", kind_of=kind_of)
    subnets, pods = SubnetController(queue, print, lambda lb_id: "error"), PodController(queue, print)
    desired = parse_desired_state(EXAMPLE)
    subnets.update(desired.subnets, desired.loadbalancers)
    pods.update(desired.pods, desired.loadbalancers)
    queue.add_after("pod/x", 60)
    status = {
        "agent": {
            "version": "1",
            "host": "gw-1",
            "synced": False,
            "generation": 7,
            "started_at": "now",
            "haproxy": {"pid": None, "running": False, "last_reload_at": None, "reloads": 0},
            "queues": queue.stats_by_kind(["loadbalancer", "subnet", "pod", "provider_network"]),
        },
        "loadbalancers": [],
        "subnets": subnets.status(),
        "provider_networks": [],
        "pods": pods.status(),
    }
    assert status["subnets"][0]["state"] == "error" and status["pods"]["items"][0]["loadbalancers"] == 1
    answer_validator("Status").validate(status)
    status["agent"]["queues"]["pod"]["depth"] = "many"
    assert not answer_validator("Status").is_valid(status)
    await queue.shutdown()
