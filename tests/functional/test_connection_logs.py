"""access_log on udp and tcp listeners with real traffic: a client's datagram through OVN to the
VIP is a start line with the load balancer's and the listener's ids, the client and the member,
and once conntrack forgets the flow an end line with its packets and bytes each way; a tcp
connection through haproxy gets the same two lines from conntrack (without a member: haproxy's
own line names the server); flows to a udp listener without access_log write nothing, and turning
the option off unsubscribes."""

from __future__ import annotations

import subprocess
import sys

from lbagent.naming import netns_name

from agentproc import wait_until
from helpers import MAC, VIP, UdpServers, udp_backends_of, wait_bound
from lbstate import backend, desired, loadbalancer, tcp_listener

MEMBER = "198.18.0.21"
CLIENT = "198.18.0.31"
LOGGED, QUIET = 5353, 5354
STREAM = 8080  # the tcp listener, to the member's HTTP server
BODY = "backend-a"
# Conntrack forgets a flow this long after its last packet; its garbage collection notices
# when the kernel paces it (up to about a minute), or at once when the table is dumped.
FLOW_TIMEOUT = 1
END_WAIT = 150
# A dump of the namespace's conntrack table: the kernel drops the expired flows it meets.
REAP = "from pyroute2 import Conntrack\nwith Conntrack() as ct:\n    list(ct.dump())"
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
    groups = {f"bg-{port}": [backend(f"be-{port}", MEMBER, port)] for port in (LOGGED, QUIET)}
    return loadbalancer(
        lb_id,
        VIP,
        MAC,
        [
            udp_listener("logged", LOGGED, access_log),
            udp_listener("quiet", QUIET, False),
            tcp_listener("stream", STREAM, "bg-tcp", access_log=access_log),
        ],
        {**groups, "bg-tcp": [backend("be-tcp", MEMBER)]},
    )


def access_lines(agent, lb_id: str, event: str) -> list[dict[str, str]]:
    """The agent's access lines of `lb_id` for `event`, as their key=value fields."""
    found = []
    for line in agent.log().splitlines():
        words = line.split()
        if "object=access" in words and f"lb={lb_id}" in words and f"event={event}" in words:
            found.append(dict(word.partition("=")[::2] for word in words if "=" in word))
    return found


def ends(agent, lb_id: str, proto: str) -> list[dict[str, str]]:
    """The end lines of `proto`, once the namespace's expired flows were dropped (see REAP)."""
    subprocess.run(["ip", "netns", "exec", netns_name(lb_id), sys.executable, "-c", REAP], check=True, timeout=30)
    return [line for line in access_lines(agent, lb_id, "end") if line["proto"] == proto]


def answered(client, port: int) -> bool:
    return udp_backends_of(client, VIP, port, 1) == {"udp-a": 1}


def test_a_udp_flow_and_a_tcp_connection_are_a_start_and_an_end_line_with_their_bytes(agent_factory, vpc, prefix):
    member = vpc.add_host("a", MEMBER, http_text=BODY)
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
        # A test of the lines, not of conntrack's timeouts: a flow ends a second after its last packet.
        timeouts = ("udp_timeout", "tcp_timeout_time_wait", "tcp_timeout_close")
        subprocess.run(
            ["ip", "netns", "exec", netns_name(lb_id), "sysctl", "-qw"]
            + [f"net.netfilter.nf_conntrack_{name}={FLOW_TIMEOUT}" for name in timeouts],
            check=True,
        )

        wait_until(lambda: answered(client, QUIET), 30, "an answer through the quiet listener")
        wait_until(lambda: answered(client, LOGGED), 30, "an answer through the logged listener")
        assert client.curl(f"http://{VIP}:{STREAM}/").strip() == BODY
        # The answered flow (an earlier datagram lost on the way has its own lines, without an answer).
        end = wait_until(
            lambda: next((e for e in ends(agent, lb_id, "udp") if e.get("packets_out") == "1"), None),
            END_WAIT,
            "the end line of the answered flow",
        )
        assert (end["listener"], end["proto"], end["member"]) == ("logged", "udp", f"{MEMBER}:{LOGGED}"), end
        assert end["client"].startswith(f"{CLIENT}:"), end
        assert (end["packets_in"], end["bytes_in"], end["bytes_out"]) == ("1", str(PAYLOAD_BYTES), str(ANSWER_BYTES))
        assert int(end["duration_ms"]) >= FLOW_TIMEOUT * 1000 - 100, end
        starts = access_lines(agent, lb_id, "start")
        udp_starts = [s for s in starts if s["proto"] == "udp"]
        assert [s["listener"] for s in udp_starts if s["client"] == end["client"]] == ["logged"], starts
        assert {s["listener"] for s in udp_starts} == {"logged"}, starts  # none for the quiet listener's flows
        assert {s["member"] for s in udp_starts} == {f"{MEMBER}:{LOGGED}"}, starts

        tcp_end = wait_until(
            lambda: next(iter(ends(agent, lb_id, "tcp")), None),
            END_WAIT,
            "the end line of the tcp connection",
        )
        assert tcp_end["listener"] == "stream" and tcp_end["client"].startswith(f"{CLIENT}:"), tcp_end
        assert "member" not in tcp_end, tcp_end
        # A handshake, a request and an answer with its body at least, each way.
        assert int(tcp_end["packets_in"]) >= 3 and int(tcp_end["packets_out"]) >= 3, tcp_end
        assert int(tcp_end["bytes_out"]) > len(BODY) + 3 * 40, tcp_end
        tcp_starts = [s for s in starts if s["proto"] == "tcp"]
        assert [(s["listener"], s["client"]) for s in tcp_starts] == [("stream", tcp_end["client"])], starts

        code, body = agent.refresh(desired(2, lb_state(lb_id, access_log=False)))
        assert code == 200, body
        wait_until(lambda: f"lb={lb_id} object=access action=unsubscribe" in agent.log(), 30, "the subscription closed")
