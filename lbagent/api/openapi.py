"""The OpenAPI 3.1 document of the v1 API, served at GET /v1/openapi.json.

The request body's schema is the one pydantic generates from the models that
validate it (`lbagent.desired.model.json_schema()`); the answers' schemas come from
`lbagent.api.responses`. The paths are listed here by hand, and a unit test holds
them equal to the routes the aiohttp application registers.

The document is served without a token: it carries no secret, only the
contract that api.md already publishes, and a client needs it before it has
been given a token.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from pydantic.json_schema import models_json_schema

from lbagent import __version__
from lbagent.api.responses import ANSWERS
from lbagent.desired.budget import MAX_SERVERS_PER_HOST, MAX_SERVERS_PER_LB
from lbagent.desired.details import MAX_DETAILS
from lbagent.desired.listener_types import KINDS, OPTION_TYPES
from lbagent.desired.model import json_schema

REF = "#/components/schemas/"
OPEN: list[dict[str, list[str]]] = []  # `security` of an operation that needs no token


def _ref(name: str) -> dict:
    return {"$ref": REF + name}


def _json(description: str, schema: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


def _error(description: str) -> dict:
    return _json(description, "Error")


UNAUTHORIZED = _error("missing or wrong bearer token")
INTERNAL = _error("an unexpected failure inside the agent (logged); nothing more is said")

PATHS: dict[str, dict[str, dict]] = {
    "/v1/refresh": {
        "post": {
            "operationId": "refresh",
            "summary": "Replace the whole desired state of this host",
            "description": "Validated completely before anything changes; accepted once persisted. "
            "Reconciliation is asynchronous unless `wait` is given.",
            "parameters": [
                {
                    "name": "wait",
                    "in": "query",
                    "required": False,
                    "description": "answer only when every load balancer reached the generation or failed, "
                    "at most this many seconds (capped at 300)",
                    "schema": {"type": "number", "minimum": 0},
                }
            ],
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("DesiredState")}}},
            "responses": {
                "200": _json("with wait: every load balancer settled; per-load-balancer results", "Results"),
                "202": _json("accepted and persisted", "Accepted"),
                "400": _error(
                    "not JSON (or a key repeated in one object), an invalid body (every problem with its JSON path, "
                    f"at most {MAX_DETAILS} and then one saying how many more) or a bad `wait`; nothing was applied"
                ),
                "401": UNAUTHORIZED,
                "409": _error("a generation lower than the one already accepted"),
                "413": _error("body over the configured limit"),
                "415": _error(
                    "not application/json, or a Content-Encoding other than identity: bodies are accepted uncompressed"
                ),
                "500": INTERNAL,
                "504": _json("with wait: time ran out before every load balancer settled", "Results"),
            },
        },
    },
    "/v1/ha/handover": {
        "post": {
            "operationId": "haHandover",
            "summary": "Hand load balancers this host holds to the next ready host of their ha.hosts",
            "description": "Each is offered to the hosts after this one in its `ha.hosts`, in order, until one "
            "whose copy is ready takes the lease (in one Northbound transaction); answers once every one is "
            "settled, at most 30 s. An empty body hands over every load balancer this host holds.",
            "requestBody": {
                "required": False,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {"loadbalancers": {"type": "array", "items": {"type": "string"}}},
                        }
                    }
                },
            },
            "responses": {
                "200": _json("one result per load balancer", "Handover"),
                "400": _error('a body other than {} or {"loadbalancers": [ID, ...]}'),
                "401": UNAUTHORIZED,
                "409": _error("high availability is not configured: no [ovn] nb"),
                "500": INTERNAL,
            },
        },
    },
    "/v1/status": {
        "get": {
            "operationId": "status",
            "summary": "The agent and every object it manages, as observed now",
            "responses": {"200": _json("status", "Status"), "401": UNAUTHORIZED, "500": INTERNAL},
        },
    },
    "/v1/loadbalancers/{lb_id}": {
        "get": {
            "operationId": "loadbalancer",
            "summary": "One load balancer's status",
            "parameters": [{"name": "lb_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {
                "200": _json("status", "LoadBalancerStatus"),
                "401": UNAUTHORIZED,
                "404": _error("no such load balancer on this host"),
                "500": INTERNAL,
            },
        },
    },
    "/v1/openapi.json": {
        "get": {
            "operationId": "openapi",
            "summary": "This document",
            "security": OPEN,
            "responses": {
                "200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {"type": "object"}}}}
            },
        },
    },
    "/healthz": {
        "get": {
            "operationId": "healthz",
            "summary": "Liveness: the process runs and its event loop turns",
            "security": OPEN,
            "responses": {"200": _json("alive", "Health")},
        },
    },
    "/readyz": {
        "get": {
            "operationId": "readyz",
            "summary": (
                "Readiness: a complete desired state is known, its first pass finished, "
                "every load balancer carries traffic (its port ovn-installed) and haproxy runs"
            ),
            "security": OPEN,
            "responses": {"200": _json("ready", "Readiness"), "503": _json("not ready, with the reason", "Readiness")},
        },
    },
    "/metrics": {
        "get": {
            "operationId": "metrics",
            "summary": "Prometheus metrics",
            "responses": {
                "200": {
                    "description": "Prometheus text exposition format",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                "401": UNAUTHORIZED,
                "500": INTERNAL,
            },
        },
    },
}


def open_paths() -> set[str]:
    """Paths whose every operation is documented as needing no token."""
    return {path for path, operations in PATHS.items() if all(op.get("security") == OPEN for op in operations.values())}


def _rewrite_refs(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: (v.replace("#/$defs/", REF) if k == "$ref" and isinstance(v, str) else _rewrite_refs(v))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_rewrite_refs(item) for item in node]
    return node


# What the validation checks beyond the JSON schema: the rules across objects
# (lbagent.desired.crosschecks), which JSON Schema cannot express, and one
# difference of number semantics. A body the schema calls valid is refused
# only for one of these.
BEYOND_THE_SCHEMA = (
    "Beyond this schema, the agent refuses (400, each problem at the path of the field that breaks it): "
    "an id used twice in its list (subnets, pods, load balancers, and within a load balancer its listeners, "
    "backend groups, backends, rules and a listener's certificates, its rules' included), a provider network name "
    "used twice, a host named twice in one provider network's custom interfaces, a pod port name used twice in a "
    "pod, two routes of a subnet to the same prefix, two listeners of a load balancer on the same transport port "
    "(http, https and tcp are all TCP), two rules of a listener for the same domain and path, two load balancers "
    "with the same address or MAC in one subnet; a network.subnet_id naming no subnet of the request, a "
    "backend_group_id naming no backend group of its load balancer; a gateway, route next hop or load balancer "
    "address outside its subnet, a gateway or load balancer address that is the subnet's network or broadcast "
    "address, a load balancer address equal to the subnet's gateway, and slow_start on a backend group that "
    "a udp listener uses; an IPv6 prefix (cidr6, a route's cidr, an access list's) with host bits set; an IPv6 "
    "backend address on a load balancer without network.ip6; an IPv6 address or "
    "prefix in the agent's own prefix for its pairs ([agent] inner_prefix6); an `ha` on an agent without "
    "`[ovn] nb`, or whose hosts do not name this agent's host. Integers must be written as integers: "
    "JSON Schema counts 1.0 as the integer 1, the agent refuses it. "
    f"A body is also refused when a load balancer needs more than {MAX_SERVERS_PER_LB} haproxy servers, or all of "
    f"them together more than {MAX_SERVERS_PER_HOST}: every listener and every rule that routes to a backend group "
    "needs one server per member of that group (its backends and the ready pods its selector takes)."
)


def _ref_name(schema: dict) -> str | None:
    for branch in [schema, *schema.get("anyOf", [])]:
        if "$ref" in branch:
            return str(branch["$ref"]).rsplit("/", 1)[-1]
    return None


def _unset(found: dict[str, dict], model: str, path: list[str]) -> dict:
    """A schema for an object of `model` whose field at `path` holds its default
    (an absent or null parent object counts as unset)."""
    name, *rest = path
    prop = found[model]["properties"][name]
    if rest:
        inner = _ref_name(prop)
        assert inner is not None, path
        return {"properties": {name: _unset(found, inner, rest)}}
    if "default" in prop:
        only: dict = {"const": prop["default"]}
    elif prop.get("type") == "array":
        only = {"maxItems": 0}
    else:
        only = {"maxProperties": 0}
    return {"properties": {name: only}}


def _when_type(types: set[str] | frozenset[str], then: dict, otherwise: dict | None = None) -> dict:
    rule = {"if": {"properties": {"listener_type": {"enum": sorted(types)}}}, "then": then}
    if otherwise is not None:
        rule["else"] = otherwise
    return rule


def _listener_rules(found: dict[str, dict]) -> list[dict]:
    """What each listener type may carry (listener_types.OPTION_TYPES: an option
    set, i.e. not at its default, on another type is refused), as if/then rules."""
    rules = []
    for option, types in OPTION_TYPES.items():
        others = set(KINDS) - types
        if others:
            rules.append(_when_type(others, _unset(found, "Listener", option.split("."))))
    tls = {name for name, kind in KINDS.items() if kind.terminates_tls}
    no_rule_certificates = {"properties": {"rules": {"items": {"properties": {"certificates": {"maxItems": 0}}}}}}
    rules.append(
        _when_type(
            tls, {"required": ["certificates"], "properties": {"certificates": {"minItems": 1}}}, no_rule_certificates
        )
    )
    udp = {name for name, kind in KINDS.items() if kind.transport == "udp"}
    rules.append(
        _when_type(
            udp,
            {"properties": {"health_check": {"properties": {"type": {"enum": ["tcp", "udp"]}}}}},
            {"properties": {"health_check": {"properties": {"type": {"enum": ["tcp", "http"]}}}}},
        )
    )
    return rules


def _health_check_rules(found: dict[str, dict]) -> list[dict]:
    """The fields only one type of health check reads stay at their defaults on the others."""
    rules = []
    for check_type, fields in (("http", ["uri", "domain", "http_code"]), ("udp", ["udp_request", "udp_expect"])):
        unset: dict = {"properties": {}}
        for field in fields:
            unset["properties"].update(_unset(found, "HealthCheck", [field])["properties"])
        rules.append({"if": {"required": ["type"], "properties": {"type": {"const": check_type}}}, "else": unset})
    return rules


def _one_of_nonempty(*names: str) -> dict:
    return {"anyOf": [{"required": [name], "properties": {name: {"minLength": 1}}} for name in names]}


def _tighten(found: dict[str, dict]) -> None:
    """The rules inside one object that pydantic's schema leaves out (model
    validators and crosschecks that look at one object only)."""
    found["DesiredState"]["description"] = BEYOND_THE_SCHEMA
    found["Redirect"]["allOf"] = [_one_of_nonempty("scheme", "host", "path")]
    found["Rule"]["allOf"] = [
        _one_of_nonempty("domain", "path"),
        # exactly one of a backend group and a redirect
        {
            "oneOf": [
                {"required": ["backend_group_id"], "properties": {"backend_group_id": {"type": "string"}}},
                {"required": ["redirect"], "properties": {"redirect": {"type": "object"}}},
            ]
        },
    ]
    found["Listener"]["allOf"] = _listener_rules(found)
    found["HealthCheck"]["allOf"] = _health_check_rules(found)


def schemas() -> dict[str, dict]:
    body = json_schema()
    found = dict(body.pop("$defs", {}))
    found["DesiredState"] = body
    _tighten(found)
    _, answers = models_json_schema([(model, "serialization") for model in ANSWERS], ref_template=REF + "{model}")
    for name, schema in answers.get("$defs", {}).items():
        if name in found:
            raise RuntimeError(f"schema name {name!r} is used by both the request and an answer")
        found[name] = schema
    return _rewrite_refs(found)


@functools.cache
def document() -> dict:
    doc = {
        "openapi": "3.1.0",
        "info": {
            "title": "lbagent",
            "version": __version__,
            "description": "Host agent for VPC load balancers on OVN gateway hosts. The region controller "
            "pushes the complete desired state of this host; the agent converges and reports.",
        },
        "security": [{"bearerAuth": []}],
        "paths": PATHS,
        "components": {
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas(),
        },
    }
    return json.loads(json.dumps(doc))  # a private deep copy: PATHS stays untouched by callers


@functools.cache
def document_bytes() -> bytes:
    return json.dumps(document(), separators=(",", ":")).encode()
