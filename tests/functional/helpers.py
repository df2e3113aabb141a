"""Shared pieces of the functional tests: the web load balancer, traffic, host state."""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator

from lbagent.naming import InterfaceNames, interface_names
from lbagent.ovnhost import links
from lbagent.ovnhost.netns import delete_netns

from agentproc import wait_until
from lbstate import backend, loadbalancer, tcp_listener

VIP, MAC = "198.18.0.12", "00:22:0a:00:00:12"


@contextlib.contextmanager
def kernel_lb(tag: str, outers: set[str]) -> Iterator[tuple[str, InterfaceNames, str]]:
    """(id, interface names, namespace) of a load balancer of a kernel-only test (no OVS), whose
    links, namespace and reply rules from `outers` are removed afterwards, pass or fail."""
    lb_id = tag + secrets.token_hex(4)
    names = interface_names(lb_id)
    netns = "lb-" + lb_id
    try:
        yield lb_id, names, netns
    finally:
        for name in (names.ovn_host, names.haproxy_host):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
        links.delete_reply_rules(outers)
        if os.path.exists(f"/run/netns/{netns}"):
            delete_netns(netns)


def sh(cmd: str) -> str:
    """A shell command's output; CalledProcessError if it fails."""
    return subprocess.run(cmd, shell=True, check=True, capture_output=True, text=True).stdout


def answers(client, url: str, count: int) -> collections.Counter:
    return collections.Counter(client.curl(url).strip() for _ in range(count))


def wait_bound(agent, lb_id: str, timeout: float = 30) -> dict:
    """Until ovn-controller says the load balancer's port is installed."""
    return wait_until(
        lambda: (lb := agent.lb(lb_id))["ovn_installed"] and lb["state"] == "ready" and lb,
        timeout,
        f"{lb_id} ready with ovn-installed",
    )


def host_state() -> dict:
    def sh(*cmd):
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    return {
        "netns": sh("ip", "netns", "list"),
        "links": sh("ip", "-br", "link"),
        "addrs": sh("ip", "-br", "addr"),
        "routes": sh("ip", "route"),
        "rules": sh("ip", "rule"),
    }


def web_lb(lb_id, backends=("a", "b"), listeners=None):
    addresses = {"a": "198.18.0.21", "b": "198.18.0.22"}
    members = [backend(f"be-{name}", addresses[name]) for name in backends]
    return loadbalancer(lb_id, VIP, MAC, listeners or [tcp_listener("lsn-80", 80, scheduler="rr")], {"bg-1": members})


# -- many fresh connections or flows from one client, counted per answering backend --

UDP_PORT = 5353
# Both families on one socket where the namespace has IPv6, IPv4 alone where it has not.
UDP_SERVER = (
    "import socket, sys\n"
    "try:\n"
    "    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
    "    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n"
    "    s.bind(('::', int(sys.argv[2])))\n"
    "except OSError:\n"
    "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "    s.bind(('0.0.0.0', int(sys.argv[2])))\n"
    "while True:\n"
    "    data, peer = s.recvfrom(2048)\n"
    "    s.sendto(sys.argv[1].encode() + b' ' + data, peer)\n"
)
# argv: vip, port, count. One line per datagram: the first word of the answer, or "error".
UDP_CLIENT = (
    "import socket, sys\n"
    "for _ in range(int(sys.argv[3])):\n"
    "    family = socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET\n"
    "    s = socket.socket(family, socket.SOCK_DGRAM)  # a new source port: a new flow\n"
    "    s.settimeout(2)\n"
    "    s.sendto(b'hello', (sys.argv[1], int(sys.argv[2])))\n"
    "    try:\n"
    "        print(s.recv(2048).split()[0].decode())\n"
    "    except OSError:\n"
    "        print('error')\n"
    "    s.close()\n"
)
# argv: host, port, path, count. A new TCP connection per request; one line each: the
# body's first line, or "error".
HTTP_CLIENT = (
    "import http.client, sys\n"
    "for _ in range(int(sys.argv[4])):\n"
    "    conn = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=5)\n"
    "    try:\n"
    "        conn.request('GET', sys.argv[3])\n"
    "        print(conn.getresponse().read().decode().split('\\n')[0] or 'empty')\n"
    "    except OSError:\n"
    "        print('error')\n"
    "    finally:\n"
    "        conn.close()\n"
)


class UdpServers:
    """UDP echo servers in VPC hosts, answering "<name> <data>"; stopped on exit."""

    def __init__(self, port: int = UDP_PORT):
        self.port = port
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, host, name: str) -> None:
        self.procs[name] = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, sys.executable, "-c", UDP_SERVER, name, str(self.port)]
        )

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.terminate()
        proc.wait(10)

    def __enter__(self) -> UdpServers:
        return self

    def __exit__(self, *exc) -> None:
        for name in list(self.procs):
            self.stop(name)


def udp_backends_of(client, vip: str, port: int, count: int) -> collections.Counter:
    """`count` datagrams, each from a new source port; how many each backend answered."""
    out = client.run(sys.executable, "-c", UDP_CLIENT, vip, str(port), str(count), timeout=count * 2 + 30)
    return collections.Counter(out.split())


def http_backends_of(client, url: str, count: int) -> collections.Counter:
    """`count` GETs of `url` (http://host:port/path), each on a new connection; the
    answers' first lines counted."""
    parts = urllib.parse.urlsplit(url)
    args = [parts.hostname or "", str(parts.port or 80), parts.path or "/", str(count)]
    out = client.run(sys.executable, "-c", HTTP_CLIENT, *args, timeout=count * 0.5 + 30)
    return collections.Counter(out.split())


def netns_routes(netns: str) -> str:
    """The main routing table of a namespace, as `ip -n <netns> route` prints it."""
    return subprocess.run(["ip", "-n", netns, "route"], capture_output=True, text=True, check=True).stdout
