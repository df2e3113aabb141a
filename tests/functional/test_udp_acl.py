"""UDP listeners enforce their access lists and `sch` in the kernel of the load
balancer's namespace: a datagram from a source the list refuses is dropped (no
answer, no ICMP error), and with `sch` every datagram of one client address
reaches the same member, whatever its source port.

One load balancer carries a UDP listener per case; the two backends answer
every port with their name, the clients are 198.18.0.31 and up."""

from __future__ import annotations

import collections
import subprocess
import sys

import pytest

from agentproc import wait_until
from helpers import MAC, VIP
from lbstate import backend, loadbalancer
from listenerenv import listener_env

CLIENTS = 4
ADMITTED, REFUSED = "198.18.0.32", "198.18.0.31"  # clients[1], clients[0]
PORTS = {"open": 5301, "white": 5302, "black": 5303, "nobody": 5304, "sch": 5305}
UDP_SERVER = (
    "import socket, sys, threading\n"
    "def serve(port):\n"
    "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "    s.bind(('0.0.0.0', port))\n"
    "    while True:\n"
    "        data, peer = s.recvfrom(2048)\n"
    "        s.sendto(sys.argv[1].encode() + b' ' + data, peer)\n"
    "threads = [threading.Thread(target=serve, args=(int(p),), daemon=True) for p in sys.argv[2:]]\n"
    "for t in threads:\n"
    "    t.start()\n"
    "threads[0].join()\n"
)
# Each datagram from a new socket: a new source port, so a new flow for conntrack.
UDP_CLIENT = (
    "import socket, sys\n"
    "for _ in range(int(sys.argv[3])):\n"
    "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "    s.settimeout(float(sys.argv[4]))\n"
    "    s.sendto(b'hello', (sys.argv[1], int(sys.argv[2])))\n"
    "    try:\n"
    "        print(s.recv(2048).split()[0].decode())\n"
    "    except OSError as exc:\n"
    "        print('error', type(exc).__name__)\n"
    "    s.close()\n"
)


def udp(listener_id: str, **fields) -> dict:
    return {
        "id": listener_id,
        "listener_type": "udp",
        "listener_port": PORTS[listener_id],
        "backend_group_id": "bg-ab",
        **fields,
    }


def udp_lb(lb_id: str, white: list[str], black: list[str]) -> dict:
    listeners = [
        udp("open"),
        udp("white", acl={"type": "white", "cidrs": white}),
        udp("black", acl={"type": "black", "cidrs": black}),
        udp("nobody", acl={"type": "white", "cidrs": []}),
        udp("sch", scheduler="sch"),
    ]
    group = [backend("be-a", "198.18.0.21", PORTS["open"]), backend("be-b", "198.18.0.22", PORTS["open"])]
    return loadbalancer(lb_id, VIP, MAC, listeners, {"bg-ab": group})


def ask(client, listener: str, count: int, timeout: float = 2.0) -> list[str]:
    """What `count` datagrams to the listener got back, one word each: the
    backend's name, or "error" (timeout: dropped; ConnectionRefusedError: an
    ICMP error came back)."""
    out = client.run(
        sys.executable,
        "-c",
        UDP_CLIENT,
        VIP,
        str(PORTS[listener]),
        str(count),
        str(timeout),
        timeout=count * (timeout + 1) + 10,
    )
    return [line.split()[0] if not line.startswith("error") else line for line in out.split("\n")[:count]]


@pytest.fixture(scope="module")
def env(sandbox, tmp_path_factory):
    with listener_env(sandbox, tmp_path_factory.mktemp("udpacl"), clients=CLIENTS, lb_ports={"dns": (MAC, VIP)}) as e:
        servers = [
            subprocess.Popen(
                ["ip", "netns", "exec", host.netns, sys.executable, "-c", UDP_SERVER, f"udp-{name}"]
                + [str(port) for port in PORTS.values()]
            )
            for name, host in e.backends.items()
        ]
        try:
            e.lb_id = f"{e.vpc.prefix}-dns"
            e.apply(udp_lb(e.lb_id, white=[f"{ADMITTED}/32"], black=[f"{REFUSED}/32"]))
            for client in e.clients:  # the first datagrams may wait for ARP
                wait_until(lambda c=client: ask(c, "open", 1)[0].startswith("udp-"), 30, f"{client.ip} answered")
            yield e
        finally:
            for server in servers:
                server.terminate()
                server.wait(10)


def client(env, address: str):
    return next(c for c in env.clients if c.ip == address)


def answered(replies: list[str]) -> bool:
    return all(reply in ("udp-a", "udp-b") for reply in replies)


def test_a_white_list_drops_datagrams_from_sources_not_in_it(env):
    assert answered(ask(client(env, ADMITTED), "white", 6))
    assert ask(client(env, REFUSED), "white", 3, timeout=1) == ["error TimeoutError"] * 3
    assert answered(ask(client(env, REFUSED), "open", 3))  # the list is the listener's alone


def test_a_black_list_drops_datagrams_from_its_sources(env):
    assert ask(client(env, REFUSED), "black", 3, timeout=1) == ["error TimeoutError"] * 3
    assert answered(ask(client(env, ADMITTED), "black", 6))


def test_an_empty_white_list_admits_no_one(env):
    for address in (ADMITTED, REFUSED):
        assert ask(client(env, address), "nobody", 2, timeout=1) == ["error TimeoutError"] * 2


def test_changed_lists_apply_and_a_removed_one_admits_everyone_again(env):
    env.apply(udp_lb(env.lb_id, white=[f"{REFUSED}/32"], black=[f"{ADMITTED}/32"]))
    assert answered(ask(client(env, REFUSED), "white", 4))
    assert ask(client(env, ADMITTED), "white", 2, timeout=1) == ["error TimeoutError"] * 2
    assert ask(client(env, ADMITTED), "black", 2, timeout=1) == ["error TimeoutError"] * 2
    assert answered(ask(client(env, REFUSED), "black", 4))

    lb = udp_lb(env.lb_id, white=[], black=[])
    for listener in lb["listeners"]:
        listener.pop("acl", None)
    env.apply(lb)
    for address in (ADMITTED, REFUSED):
        for listener in ("white", "black", "nobody"):
            assert answered(ask(client(env, address), listener, 2)), (address, listener)
    env.apply(udp_lb(env.lb_id, white=[f"{ADMITTED}/32"], black=[f"{REFUSED}/32"]))


def test_the_lists_live_in_the_filter_table_and_a_converged_pass_writes_nothing(env):
    netns = env.agent.lb(env.lb_id)["netns"]
    save = subprocess.run(
        ["ip", "netns", "exec", netns, "iptables-legacy-save", "-t", "filter"],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    ours = [line for line in save.splitlines() if line.startswith("-A LBAGENT-ACL ")]
    # white: one RETURN and the DROP; black: one DROP; nobody: the DROP alone.
    assert sorted(line.rsplit(" ", 1)[1] for line in ours) == ["DROP"] * 3 + ["RETURN"], save
    assert any(line.startswith("-A FORWARD ") and line.endswith("-j LBAGENT-ACL") for line in save.splitlines())

    before = env.agent.status()["agent"]["writes"]["iptables"]
    env.apply(udp_lb(env.lb_id, white=[f"{ADMITTED}/32"], black=[f"{REFUSED}/32"]))  # the next generation, unchanged
    assert env.agent.status()["agent"]["writes"]["iptables"] == before


def test_sch_sends_every_datagram_of_a_client_address_to_one_member(env):
    """30 flows of one client on one member: by chance, with the random split
    over two members, 1 in 2^29. Over the clients both members are used."""
    chosen = {}
    for c in env.clients:
        first = collections.Counter(ask(c, "sch", 30))
        again = collections.Counter(ask(c, "sch", 10))
        assert len(first) == 1 and answered(list(first)), (c.ip, first)
        assert again == {next(iter(first)): 10}, (c.ip, first, again)
        chosen[c.ip] = next(iter(first))
    assert set(chosen.values()) == {"udp-a", "udp-b"}, chosen
    # The other listeners keep the random split: one client's flows reach both.
    seen = wait_until(
        lambda: (s := set(ask(env.clients[0], "open", 16))) >= {"udp-a", "udp-b"} and s, 30, "flows on both members"
    )
    assert seen == {"udp-a", "udp-b"}
