"""A load balancer's `ha` field (api.md "High availability"): the hosts that serve it.

Owns the model and the rules of the field alone: 2 to 8 distinct host names,
the first the preferred one. Whether this host is one of them, and whether
it can take part at all (an `[ovn] nb` configured), depends on the agent, not
on the body: `host_problems` says so, for the API to answer with a 400.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lbagent.desired.details import json_pointer
from lbagent.desired.fields import Hostname

if TYPE_CHECKING:
    from lbagent.desired.model import LoadBalancer

MIN_HA_HOSTS = 2
MAX_HA_HOSTS = 8


class HighAvailability(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    hosts: list[Hostname] = Field(
        min_length=MIN_HA_HOSTS, max_length=MAX_HA_HOSTS, json_schema_extra={"uniqueItems": True}
    )
    preempt: bool = False

    @field_validator("hosts")
    @classmethod
    def distinct(cls, hosts: list[str]) -> list[str]:
        repeated = sorted({host for host in hosts if hosts.count(host) > 1})
        if repeated:
            raise ValueError(f"must name each host once; given more than once: {', '.join(repeated)}")
        return hosts

    def rank(self, host: str) -> int:
        """Where `host` stands in the priority order (0 is preferred); past the end if not listed."""
        return self.hosts.index(host) if host in self.hosts else len(self.hosts)


def host_problems(loadbalancers: Iterable[LoadBalancer], host: str, nb_configured: bool) -> list[dict[str, str]]:
    """The api.md error details of load balancers whose `ha` this agent cannot serve."""
    problems = []
    for index, lb in enumerate(loadbalancers):
        if lb.ha is None:
            continue
        if not nb_configured:
            problems.append(
                {
                    "path": json_pointer(("loadbalancers", index, "ha")),
                    "message": "high availability needs the OVN Northbound database:"
                    " this agent has no [ovn] nb configured",
                }
            )
        elif host not in lb.ha.hosts:
            problems.append(
                {
                    "path": json_pointer(("loadbalancers", index, "ha", "hosts")),
                    "message": f"does not name this host ({host}); push the load balancer only to the hosts listed",
                }
            )
    return problems
