"""access_log on a udp listener with real traffic: a client's datagram through OVN to the VIP
is a start line with the load balancer's and the listener's ids, the client and the member, and
once conntrack forgets the flow an end line with its packets and bytes each way; flows to a udp
listener without access_log write nothing, and turning the option off unsubscribes."""

from __future__ import annotations

import subprocess

from lbagent.naming import netns_name

from agentproc import wait_until
from helpers import MAC, VIP, UdpServers, udp_backends_of, wait_bound
from lbstate import backend, desired, loadbalancer

MEMBER = "198.18.0.21"
CLIENT = "198.18.0.31"
LOGGED, QUIET = 5353, 5354
# Conntrack forgets a flow this long after its last datagram, then its garbage collection
# notices, which the kernel paces by itself (up to about a minute).
FLOW_TIMEOUT = 1
END_WAIT = 150
PAYLOAD_BYTES = len("hello") + 28  # what UDP_CLIENT sends, with its IPv4 and UDP headers
ANSWER_BYTES = len("udp-a hello") + 28  # what UdpServers answers


def udp_listener(listener_id: str, port: int, access_log: bool) -> dict:
    return {
        "id": listener_id,
        "listener_type": "udp",
        "listener_port": port,
        "backend_group_id": f"bg-{port}",
        "access_log": access_log,
    }


def lb_state(lb_id: str, access_log: bool) -> dict:
    return loadbalancer(
        lb_id,
        VIP,
        MAC,
        [udp_listener("logged", LOGGED, access_log), udp_listener("quiet", QUIET, False)],
        {f"bg-{port}": [backend(f"be-{port}", MEMBER, port)] for port in (LOGGED, QUIET)},
    )


def access_lines(agent, lb_id: str, event: str) -> list[dict[str, str]]:
    """The agent's access lines of `lb_id` for `event`, as their key=value fields."""
    found = []
    for line in agent.log().splitlines():
        words = line.split()
        if "object=access" in words and f"lb={lb_id}" in words and f"event={event}" in words:
            found.append(dict(word.partition("=")[::2] for word in words if "=" in word))
    return found


def answered(client, port: int) -> bool:
    return udp_backends_of(client, VIP, port, 1) == {"udp-a": 1}


def test_a_udp_flow_is_a_start_and_an_end_line_with_its_bytes(agent_factory, vpc, prefix):
    member = vpc.add_host("a", MEMBER)
    client = vpc.add_host("client", CLIENT)
    lb_id = f"{prefix}-udplog"
    vpc.add_lb_port(lb_id, MAC, VIP)
    with UdpServers(LOGGED) as logged_servers, UdpServers(QUIET) as quiet_servers:
        logged_servers.start(member, "udp-a")
        quiet_servers.start(member, "udp-a")
        agent = agent_factory()
        code, body = agent.refresh(desired(1, lb_state(lb_id, access_log=True)))
        assert code == 200, body
        wait_bound(agent, lb_id)
        # A test of the lines, not of conntrack's timeouts: the flow ends a second after its answer.
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                netns_name(lb_id),
                "sysctl",
                "-qw",
                f"net.netfilter.nf_conntrack_udp_timeout={FLOW_TIMEOUT}",
            ],
            check=True,
        )

        wait_until(lambda: answered(client, QUIET), 30, "an answer through the quiet listener")
        wait_until(lambda: answered(client, LOGGED), 30, "an answer through the logged listener")
        # The answered flow (an earlier datagram lost on the way has its own lines, without an answer).
        end = wait_until(
            lambda: next((e for e in access_lines(agent, lb_id, "end") if e.get("packets_out") == "1"), None),
            END_WAIT,
            "the end line of the answered flow",
        )
        assert (end["listener"], end["proto"], end["member"]) == ("logged", "udp", f"{MEMBER}:{LOGGED}"), end
        assert end["client"].startswith(f"{CLIENT}:"), end
        assert (end["packets_in"], end["bytes_in"], end["bytes_out"]) == ("1", str(PAYLOAD_BYTES), str(ANSWER_BYTES))
        assert int(end["duration_ms"]) >= FLOW_TIMEOUT * 1000 - 100, end
        starts = access_lines(agent, lb_id, "start")
        assert [s["listener"] for s in starts if s["client"] == end["client"]] == ["logged"], starts
        assert {s["listener"] for s in starts} == {"logged"}, starts  # none for the quiet listener's flows
        assert {s["member"] for s in starts} == {f"{MEMBER}:{LOGGED}"}, starts

        code, body = agent.refresh(desired(2, lb_state(lb_id, access_log=False)))
        assert code == 200, body
        wait_until(lambda: f"lb={lb_id} object=access action=unsubscribe" in agent.log(), 30, "the subscription closed")
