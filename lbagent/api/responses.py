"""The shapes of the API's answers (api.md "Status" and errors), for the OpenAPI document.

These models describe; they do not build the answers (the agent and the
handlers do). Tests validate real answers against the schemas generated from
them, so a drift between the document and the implementation fails a test.
Every object allows fields not listed here: clients must ignore what they
do not know, and the agent may report more than this minimum.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

LbState = Literal["pending", "ready", "error", "deleting"]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorDetail(_Answer):
    path: str  # JSON pointer into the request body; "" is the whole body
    message: str


class Error(_Answer):
    error: str
    message: str
    details: list[ErrorDetail]


class Accepted(_Answer):
    generation: int


class LoadBalancerResult(_Answer):
    id: str
    state: LbState
    reason: str | None = None  # why it is not ready: see LoadBalancerStatus.reason
    generation: int | None
    last_error: str | None


class Results(_Answer):
    generation: int
    loadbalancers: list[LoadBalancerResult]


class Health(_Answer):
    status: Literal["ok"]


class Readiness(_Answer):
    ready: bool
    reason: str | None = None


class HaproxyStatus(_Answer):
    pid: int | None
    running: bool
    last_reload_at: str | None
    reloads: int
    failed_reloads: int = 0
    live_updates: int = 0  # server-only changes applied through the stats socket, without a reload
    servers_draining: int = 0  # servers removed live that still had connections (in maintenance)


class QueueStats(_Answer):
    """One kind of key on the agent's work queue (loadbalancer, subnet, pod, provider_network)."""

    depth: int  # ready to be handled now
    delayed: int  # waiting for a retry after a failure
    processing: int  # being handled
    retrying: int  # failed at their last handling, not succeeded since


class AgentHaStatus(_Answer):
    nb: str  # the Northbound database the leases live in
    chassis: str | None  # this host's chassis, which requested-chassis names while it is active
    in_contact: bool
    lease_seconds: float
    last_error: str | None = None


class AgentStatus(_Answer):
    version: str
    host: str
    synced: bool
    generation: int | None
    started_at: str
    ready: bool = False
    haproxy: HaproxyStatus
    queues: dict[str, QueueStats] = {}
    ha: AgentHaStatus | None = None  # None: no [ovn] nb, no high availability


class Interfaces(_Answer):
    ovn: list[str]
    haproxy: list[str]


class RuleStatus(_Answer):
    id: str
    domain: str
    path: str
    backend_group_id: str | None = None
    redirect: dict | None = None


class ListenerStatus(_Answer):
    id: str
    listener_type: str
    listener_port: int
    state: str  # a load balancer state, or "disabled"
    backend_group_id: str | None = None
    rules: list[RuleStatus] = []


class BackendStatus(_Answer):
    id: str
    address: str
    port: int
    mapped_port: int | None
    health: str  # up | down | draining | maint | unchecked | unknown
    backup: bool = False  # serves only while no other member of its group is up
    # ok | connect_refused | timeout | bad_status:<code> | bad_response | draining | disabled
    health_reason: str | None = None
    health_since: str | None = None  # the last change of health, or when checks started


class HaStatus(_Answer):
    # unknown: no contact with the Northbound database; the host serves as it was.
    role: Literal["active", "standby", "unknown"]
    active_host: str | None
    term: int
    since: str  # when this host's role last changed
    # Seconds from the last this host heard of the holder (a beat or a change of the lease)
    # to its taking the lease, when it took it last.
    last_failover_s: float | None = None


class DrainingServer(_Answer):
    id: str
    remaining: int  # seconds until its sessions are shut


class LoadBalancerStatus(_Answer):
    id: str
    # ready: it carries traffic (its pass succeeded, ovn-controller installed
    # its OVS port, and haproxy runs if a listener needs it).
    state: LbState
    # Why it is not ready, None when it is: for pending e.g. "waiting for
    # ovn-installed" or "haproxy not running: ...", for error its last_error.
    reason: str | None = None
    generation: int | None
    netns: str
    inner: str | None
    outer: str | None
    interfaces: Interfaces | None
    ovs_port: str | None
    ovn_installed: bool
    listeners: list[ListenerStatus]
    backends: list[BackendStatus]
    last_error: str | None
    # Accepted certificates that have expired or are not valid yet.
    certificate_warnings: list[ErrorDetail] = []
    retries: int
    last_reconciled_at: str | None
    ha: HaStatus | None = None  # None without `ha`, or before this host has read its lease
    draining: list[DrainingServer] = []  # backends removed or at weight 0 whose connections are kept


class HandoverResult(_Answer):
    id: str
    # handed_over: another host took it; not_taken: no standby took it in time;
    # not_active: this host does not hold it; not_ha: it has no `ha` here;
    # unknown: contact with the Northbound database was lost meanwhile.
    result: Literal["handed_over", "not_taken", "not_active", "not_ha", "unknown"]
    active_host: str | None = None


class Handover(_Answer):
    loadbalancers: list[HandoverResult]


class SubnetRoute(_Answer):
    cidr: str
    nexthop: str


class SubnetStatus(_Answer):
    id: str
    state: Literal["pending", "ready", "error"]
    loadbalancers: int  # how many load balancers are on it
    cidr: str | None = None
    gateway: str | None = None
    mtu: int | None = None
    routes: list[SubnetRoute] = []
    retries: int = 0
    error: str | None = None  # its change failed to reach its load balancers, or some of them failed


class ProviderNetworkStatus(_Answer):
    name: str
    state: str  # pending | ready | error | excluded
    bridge: str | None = None
    interface: str | None = None
    mtu: int | None = None
    error: str | None = None
    retries: int = 0


class PodStatus(_Answer):
    id: str
    namespace: str
    name: str
    ip: str
    ready: bool
    loadbalancers: int  # how many load balancers' groups take it as a member
    pending: bool = False  # its change has not yet reached those load balancers


class PodsStatus(_Answer):
    count: int
    ready: int = 0
    items: list[PodStatus] = []


class Status(_Answer):
    agent: AgentStatus
    loadbalancers: list[LoadBalancerStatus]
    subnets: list[SubnetStatus]
    provider_networks: list[ProviderNetworkStatus]
    pods: PodsStatus


ANSWERS: tuple[type[BaseModel], ...] = (
    Error,
    Accepted,
    Results,
    Health,
    Readiness,
    Status,
    LoadBalancerStatus,
    Handover,
)
