"""Desired-state bodies for functional tests, built the way a region controller would."""

from __future__ import annotations

SUBNET = {"id": "net-1", "cidr": "198.18.0.0/24", "gateway": "198.18.0.1", "mtu": 1442}


def backend(backend_id: str, address: str, port: int = 8000, **extra) -> dict:
    return {"id": backend_id, "address": address, "port": port, **extra}


def tcp_listener(listener_id: str, port: int, group: str = "bg-1", **extra) -> dict:
    return {"id": listener_id, "listener_type": "tcp", "listener_port": port, "backend_group_id": group, **extra}


def loadbalancer(lb_id: str, ip: str, mac: str, listeners: list[dict], groups: dict[str, list[dict]], **extra) -> dict:
    return {
        "id": lb_id,
        "name": f"test {lb_id}",
        "network": {"subnet_id": SUBNET["id"], "ip": ip, "mac": mac},
        "listeners": listeners,
        "backend_groups": [{"id": gid, "backends": members} for gid, members in groups.items()],
        **extra,
    }


def desired(generation: int, *lbs: dict, subnets: list[dict] | None = None) -> dict:
    return {"generation": generation, "subnets": subnets or [SUBNET], "loadbalancers": list(lbs)}
