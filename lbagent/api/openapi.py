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
                    "not JSON, an invalid body (every problem with its JSON path) or a bad `wait`; nothing was applied"
                ),
                "401": UNAUTHORIZED,
                "409": _error("a generation lower than the one already accepted"),
                "413": _error("body over the configured limit"),
                "415": _error("not application/json"),
                "500": INTERNAL,
                "504": _json("with wait: time ran out before every load balancer settled", "Results"),
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
            "summary": "Readiness: a complete desired state is known and its first pass finished",
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


def schemas() -> dict[str, dict]:
    body = json_schema()
    found = dict(body.pop("$defs", {}))
    found["DesiredState"] = body
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
