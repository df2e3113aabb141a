"""The HTTP API of api.md on aiohttp: refresh, status, health, readiness, metrics.

Every error answer is JSON `{"error", "message", "details"}`. The refresh body
is parsed and validated completely before the agent is asked to accept it, so
an invalid body changes nothing.
"""

from __future__ import annotations

import hmac
import json
import logging
import math

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from lbagent.errors import InvalidDesiredState, StaleGeneration
from lbagent.model import parse_desired_state

log = logging.getLogger(__name__)

MAX_WAIT = 300.0
OPEN_PATHS = {"/healthz", "/readyz"}  # probes carry no token
AGENT = web.AppKey("agent", object)


def error_response(status: int, code: str, message: str, details: list | None = None) -> web.Response:
    return web.json_response({"error": code, "message": message, "details": details or []}, status=status)


def create_app(agent, token: str | None, max_body_bytes: int) -> web.Application:
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_errors_as_json, _auth(token)])
    app[AGENT] = agent
    app.router.add_post("/v1/refresh", refresh)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/loadbalancers/{lb_id}", loadbalancer)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


@web.middleware
async def _errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.content_type == "application/json":
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(exc.status, "http_error")
        return error_response(exc.status, code, exc.reason)


def _auth(token: str | None):
    expected = token.encode() if token else None

    @web.middleware
    async def check(request: web.Request, handler):
        if expected is None or request.path in OPEN_PATHS:
            return await handler(request)
        scheme, _, offered = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(offered.strip().encode(), expected):
            return error_response(401, "unauthorized", "missing or wrong bearer token")
        return await handler(request)

    return check


def _wait_seconds(request: web.Request) -> float | None:
    raw = request.query.get("wait")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise web.HTTPBadRequest(reason="wait must be a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise web.HTTPBadRequest(reason="wait must be a number of seconds")
    return min(value, MAX_WAIT)


async def refresh(request: web.Request) -> web.Response:
    agent = request.app[AGENT]
    if request.content_type != "application/json":
        return error_response(415, "unsupported_media_type", "the body must be application/json")
    wait = _wait_seconds(request)
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return error_response(400, "invalid_json", f"the body is not JSON: {exc}")
    try:
        desired = parse_desired_state(body)
    except InvalidDesiredState as exc:
        return error_response(400, "invalid_body", "the desired state is invalid; nothing was applied", exc.details)
    try:
        generation = await agent.refresh(desired, body)
    except StaleGeneration as exc:
        return error_response(409, "stale_generation", str(exc))
    if wait is None:
        return web.json_response({"generation": generation}, status=202)
    settled = await agent.worker.wait_settled(generation, wait)
    results = agent.results(generation)
    return web.json_response(results, status=200 if settled else 504)


async def status(request: web.Request) -> web.Response:
    return web.json_response(await request.app[AGENT].status())


async def loadbalancer(request: web.Request) -> web.Response:
    lb_id = request.match_info["lb_id"]
    found = await request.app[AGENT].loadbalancer_status(lb_id)
    if found is None:
        return error_response(404, "not_found", f"no load balancer {lb_id!r} on this host")
    return web.json_response(found)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    reason = request.app[AGENT].not_ready_reason()
    if reason:
        return web.json_response({"ready": False, "reason": reason}, status=503)
    return web.json_response({"ready": True})


async def metrics(request: web.Request) -> web.Response:
    request.app[AGENT].update_gauges()
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})
