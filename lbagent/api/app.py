"""The HTTP API of api.md on aiohttp: refresh, status, health, readiness, metrics, OpenAPI.

Every error answer is JSON `{"error", "message", "details"}`, an unexpected
failure included (500, logged). The refresh body is parsed and validated
completely before the agent is asked to accept it, so an invalid body changes
nothing. Which paths need no token is read from the OpenAPI document, so the
document and the access rules cannot disagree. Every answer is counted in
`lbagent_api_requests_total` by route template, never by raw path.

Decoding and validating a refresh body takes a CPU-second or more for a large
host, so it runs on a thread of its own, off the event loop (which keeps
answering /healthz and driving the load balancers), one body at a time (the
parser remembers the last valid body). A compressed body is refused before it
is read: it could expand past the body limit.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
from dataclasses import dataclass
from typing import Protocol, cast

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from lbagent.api.openapi import document_bytes, open_paths
from lbagent.api.status import StatusReporter
from lbagent.desired.details import capped
from lbagent.desired.fields import MAX_ID_LEN, MAX_LOADBALANCERS
from lbagent.desired.model import DesiredState
from lbagent.desired.parser import DuplicateKeys, RefreshParser, decode
from lbagent.errors import InvalidDesiredState, LbAgentError, StaleGeneration
from lbagent.metrics import API_REQUESTS, AgentRegistry
from lbagent.support.blocking import BlockingPool

log = logging.getLogger(__name__)


class RefreshTarget(Protocol):
    """What the handlers ask of the agent (the `Agent`)."""

    async def refresh(self, desired: DesiredState, raw: dict, raw_text: str | None = None) -> int: ...
    async def wait_settled(self, generation: int, timeout: float) -> bool: ...
    def not_ready_reason(self) -> str | None: ...
    async def ha_handover(self, lb_ids: list[str] | None, timeout: float) -> list[dict] | None: ...


class Reporter(Protocol):
    """What the handlers ask of the status documents (a `StatusReporter`)."""

    async def status(self) -> dict: ...
    async def loadbalancer_status(self, lb_id: str) -> dict | None: ...
    def results(self, generation: int) -> dict: ...


MAX_WAIT = 300.0
OPEN_PATHS = frozenset(open_paths())  # probes and the OpenAPI document carry no token
AGENT = web.AppKey[RefreshTarget]("agent")
REPORTER = web.AppKey[Reporter]("reporter")
METRICS = web.AppKey("metrics", AgentRegistry)
PARSER = web.AppKey("parser", RefreshParser)
PARSING = web.AppKey("parsing", BlockingPool)
IDENTITY = "identity"


def error_response(status: int, code: str, message: str, details: list | None = None) -> web.Response:
    return web.json_response({"error": code, "message": message, "details": details or []}, status=status)


def create_app(agent, token: str | None, max_body_bytes: int, reporter=None) -> web.Application:
    """The application over `agent`; `reporter` answers the status documents (default: a
    StatusReporter reading the agent)."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_count_requests, _errors_as_json, _auth(token)])
    app[AGENT] = agent
    app[REPORTER] = reporter if reporter is not None else StatusReporter(agent)
    app[METRICS] = AgentRegistry(agent)
    app[PARSER] = RefreshParser()
    # One thread: two bodies never race on the parser's memory of the last one.
    app[PARSING] = BlockingPool("api-parse", threads=1)
    app.on_cleanup.append(_stop_parsing)
    app.router.add_post("/v1/refresh", refresh)
    app.router.add_post("/v1/ha/handover", handover)
    # No implicit HEAD routes: the OpenAPI document lists exactly what is served.
    app.router.add_get("/v1/status", status, allow_head=False)
    app.router.add_get("/v1/loadbalancers/{lb_id}", loadbalancer, allow_head=False)
    app.router.add_get("/v1/openapi.json", openapi, allow_head=False)
    app.router.add_get("/healthz", healthz, allow_head=False)
    app.router.add_get("/readyz", readyz, allow_head=False)
    app.router.add_get("/metrics", metrics, allow_head=False)
    return app


async def _stop_parsing(app: web.Application) -> None:
    await asyncio.to_thread(app[PARSING].shutdown)


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def _count_requests(request: web.Request, handler):
    code = 500
    try:
        response = await handler(request)
        code = response.status
        return response
    except web.HTTPException as exc:
        code = exc.status
        raise
    finally:
        API_REQUESTS.labels(request.method, _route(request), str(code)).inc()


@web.middleware
async def _errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.content_type == "application/json":
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(exc.status, "http_error")
        return error_response(exc.status, code, exc.reason)
    except Exception:
        # A bug or a host failure (a full disk under the state file): logged
        # with its traceback, answered without it.
        log.exception("action=api result=error method=%s route=%s", request.method, _route(request))
        return error_response(500, "internal_error", "the agent failed to answer; see its log")


def _auth(token: str | None):
    expected = token.encode() if token else None

    @web.middleware
    async def check(request: web.Request, handler):
        if expected is None or request.path in OPEN_PATHS:
            return await handler(request)
        scheme, _, offered = request.headers.get("Authorization", "").partition(" ")
        given = _header_bytes(offered.strip())
        if scheme.lower() != "bearer" or given is None or not hmac.compare_digest(given, expected):
            return error_response(401, "unauthorized", "missing or wrong bearer token")
        return await handler(request)

    return check


def _header_bytes(value: str) -> bytes | None:
    """A header value as the bytes that came (aiohttp keeps bytes that are not
    UTF-8 as lone surrogates), or None when it cannot be told."""
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that no byte became
        return None


def _wait_seconds(request: web.Request) -> float | None:
    raw = request.query.get("wait")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise InvalidParameter("wait", "must be a number of seconds, 0 or more")
    return min(value, MAX_WAIT)


class InvalidParameter(LbAgentError):
    """A query parameter that is not what the API allows (400 `invalid_parameter`)."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


@dataclass(frozen=True)
class _Parsed:
    desired: DesiredState
    body: dict
    text: str | None  # the body to persist verbatim, if it is UTF-8


class BodyNotJson(LbAgentError):
    """A refresh body that is not JSON (400 `invalid_json`); `details` as api.md's."""

    def __init__(self, message: str, details: list[dict[str, str]]):
        super().__init__(message)
        self.details = details


def _parse_body(parser: RefreshParser, raw: bytes) -> _Parsed:
    """The refresh body decoded and validated (blocking: run on the PARSING thread)."""
    try:
        body, comparable = decode(raw)
    except DuplicateKeys as exc:
        details = [{"path": path, "message": "key given more than once in its object"} for path in exc.paths]
        raise BodyNotJson(f"the body is not JSON the agent accepts: {exc}", capped(details, total=exc.total)) from None
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        message = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise BodyNotJson(
            f"the body is not JSON: {message}", [{"path": "", "message": f"not JSON: {message}"}]
        ) from None
    desired = parser.parse(body, comparable)
    # The parser accepts nothing but a JSON object, so the body is a dict.
    return _Parsed(desired, cast(dict, body), _utf8_text(raw))


def _encodings(request: web.Request) -> list[str]:
    """The body's content codings other than identity."""
    codings = (
        part.strip().lower() for value in request.headers.getall("Content-Encoding", []) for part in value.split(",")
    )
    return [coding for coding in codings if coding and coding != IDENTITY]


async def refresh(request: web.Request) -> web.Response:
    agent = request.app[AGENT]
    if request.content_type != "application/json":
        return error_response(415, "unsupported_media_type", "the body must be application/json")
    if _encodings(request):
        return error_response(
            415, "unsupported_media_type", "content encodings are not accepted: send the body uncompressed"
        )
    try:
        wait = _wait_seconds(request)
    except InvalidParameter as exc:
        # "?name" marks a query parameter; a detail about the body has a JSON pointer path.
        return error_response(
            400,
            "invalid_parameter",
            f"query parameter {exc.name} {exc}",
            [{"path": f"?{exc.name}", "message": str(exc)}],
        )
    raw = await request.read()
    try:
        parsed = await request.app[PARSING].run(_parse_body, request.app[PARSER], raw)
    except BodyNotJson as exc:
        return error_response(400, "invalid_json", str(exc), exc.details)
    except InvalidDesiredState as exc:
        return error_response(400, "invalid_body", "the desired state is invalid; nothing was applied", exc.details)
    try:
        generation = await agent.refresh(parsed.desired, parsed.body, parsed.text)
    except StaleGeneration as exc:
        return error_response(409, "stale_generation", str(exc))
    except InvalidDesiredState as exc:  # valid, but not for this host (api.md "High availability")
        return error_response(400, "invalid_body", "the desired state is invalid; nothing was applied", exc.details)
    # The decoded body (3 MB at a thousand load balancers) is not held through a
    # wait; its bytes are (600 kB: aiohttp keeps what it read for the request).
    del parsed
    if wait is None:
        return web.json_response({"generation": generation}, status=202)
    settled = await agent.wait_settled(generation, wait)
    results = request.app[REPORTER].results(generation)
    return web.json_response(results, status=200 if settled else 504)


def _utf8_text(raw: bytes) -> str | None:
    """The body as text to persist verbatim: JSON in UTF-8 without a BOM (json.loads
    also reads UTF-16 and UTF-32, which cannot sit inside the UTF-8 state file)."""
    if json.detect_encoding(raw) != "utf-8":
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # json.loads passes encoded surrogates, which UTF-8 forbids
        return None


HANDOVER_TIMEOUT = 30.0  # seconds a handover answer waits for the standbys at most


async def handover(request: web.Request) -> web.Response:
    """Hand load balancers this host holds to the next host of their `ha.hosts`."""
    try:
        body = await request.json() if request.can_read_body else {}
    except ValueError:
        return error_response(400, "invalid_json", "the body is not JSON")
    ids = body.get("loadbalancers") if isinstance(body, dict) else None
    if not isinstance(body, dict) or set(body) - {"loadbalancers"} or not _ids_or_none(ids):
        return error_response(
            400,
            "invalid_body",
            'the body must be {} or {"loadbalancers": [ID, ...]}',
            [{"path": "/loadbalancers", "message": f"must be a list of at most {MAX_LOADBALANCERS} load balancer ids"}],
        )
    results = await request.app[AGENT].ha_handover(ids, HANDOVER_TIMEOUT)
    if results is None:
        return error_response(
            409, "ha_not_configured", "high availability needs the OVN Northbound database: [ovn] nb is not set"
        )
    return web.json_response({"loadbalancers": results})


def _ids_or_none(ids: object) -> bool:
    return ids is None or (
        isinstance(ids, list)
        and len(ids) <= MAX_LOADBALANCERS
        and all(isinstance(i, str) and 0 < len(i) <= MAX_ID_LEN for i in ids)
    )


def _fast_json(document: object) -> str:
    # orjson: the status of a thousand load balancers took the standard encoder
    # tens of milliseconds with the event loop standing still.
    return orjson.dumps(document, option=orjson.OPT_NON_STR_KEYS).decode()


async def status(request: web.Request) -> web.Response:
    return web.json_response(await request.app[REPORTER].status(), dumps=_fast_json)


async def loadbalancer(request: web.Request) -> web.Response:
    lb_id = request.match_info["lb_id"]
    found = await request.app[REPORTER].loadbalancer_status(lb_id)
    if found is None:
        return error_response(404, "not_found", f"no load balancer {lb_id!r} on this host")
    return web.json_response(found)


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=document_bytes(), content_type="application/json")


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    reason = request.app[AGENT].not_ready_reason()
    if reason:
        return web.json_response({"ready": False, "reason": reason}, status=503)
    return web.json_response({"ready": True})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[METRICS]), headers={"Content-Type": CONTENT_TYPE_LATEST})
