"""drain_timeout, client_certificate and access_log with real traffic: a long download
outlives its backend's removal (and a restart of the agent) until the drain timeout, then is cut; mutual TLS refuses or
admits a client without a certificate and tells the backend; each request is a line of the
agent's log with its load balancer and listener ids."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from test_traffic_options import start_agent

from devtools.topology import self_signed_certificate
from tests.unit.haproxy.clientca import Authority, pem_of

from agentproc import wait_until
from helpers import MAC, VIP
from lbstate import backend, desired, loadbalancer, tcp_listener

PRIMARY, SPARE = "198.18.0.21", "198.18.0.22"
DRAIN = 12  # seconds: room for an agent restart within the drain
# argv: port. Sends one byte every 50 ms to each client for two minutes.
TRICKLE_SERVER = (
    "import socket, sys, threading, time\n"
    "def feed(c):\n"
    "    try:\n"
    "        for _ in range(2400):\n"
    "            c.sendall(b'x'); time.sleep(0.05)\n"
    "    except OSError:\n"
    "        pass\n"
    "s = socket.create_server(('0.0.0.0', int(sys.argv[1])))\n"
    "while True:\n"
    "    threading.Thread(target=feed, args=(s.accept()[0],), daemon=True).start()\n"
)
# argv: address, port. Prints "open" once bytes flow, then "closed <monotonic time> <bytes>" at EOF.
DOWNLOAD = (
    "import socket, sys, time\n"
    "c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=150)\n"
    "total = len(c.recv(1))\n"
    "print('open', flush=True)\n"
    "while (data := c.recv(4096)):\n"
    "    total += len(data)\n"
    "print('closed', time.monotonic(), total, flush=True)\n"
)


def in_netns(host, code: str, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", host.netns, sys.executable, "-c", code, *args], **popen)


def test_a_long_download_outlives_its_backends_removal_and_an_agent_restart_until_the_drain_timeout(
    agent_factory, vpc, prefix
):
    old = vpc.add_host("a", PRIMARY)
    vpc.add_host("b", SPARE)
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-drain"
    listener = tcp_listener("dl", 80, scheduler="wrr")

    def lb(*members):
        state = loadbalancer(lb_id, VIP, MAC, [listener], {"bg-1": list(members)})
        state["backend_groups"][0]["drain_timeout"] = DRAIN
        return state

    server = in_netns(old, TRICKLE_SERVER, "8000")
    download = None
    try:
        wait_until(lambda: old.run("ss", "-Hltn", "sport = :8000").strip(), 10, "the trickle server")
        agent = start_agent(agent_factory, vpc, lb_id, lb(backend("old", PRIMARY), backend("new", SPARE, weight=0)))
        download = in_netns(client, DOWNLOAD, VIP, "80", stdout=subprocess.PIPE, text=True)
        assert download.stdout.readline().strip() == "open"

        code, body = agent.refresh(desired(2, lb(backend("new", SPARE))))
        assert code == 200, body
        removed_at = time.monotonic()
        draining = wait_until(lambda: agent.lb(lb_id)["draining"], 10, "old shown draining")
        assert [d["id"] for d in draining] == ["old"] and 0 < draining[0]["remaining"] <= DRAIN
        shown = agent.cli("status", lb_id).stdout
        assert "draining (established connections kept until the drain timeout)" in shown, shown

        agent.stop()  # the deadline is kept on disk: a restarted agent still cuts on time
        agent.start()
        assert [d["id"] for d in agent.lb(lb_id)["draining"]] == ["old"]
        assert download.poll() is None  # still flowing after its backend went

        words = download.stdout.readline().split()  # blocks until the connection is cut
        assert words[0] == "closed", words
        cut_after = float(words[1]) - removed_at
        assert DRAIN - 0.5 <= cut_after <= DRAIN + 10, cut_after  # at the deadline, not at the end of the stream
        assert int(words[2]) >= (DRAIN - 1) * 10  # bytes kept flowing while it drained
        wait_until(lambda: not agent.lb(lb_id)["draining"], 10, "nothing left draining")
    finally:
        for proc in (download, server):
            if proc is not None:
                proc.kill()
                proc.wait(10)


def https_listener(listener_id: str, port: int, cert: tuple[str, str], ca: str, verify: str) -> dict:
    return {
        "id": listener_id,
        "listener_type": "https",
        "listener_port": port,
        "backend_group_id": "bg-1",
        "certificates": [{"id": "srv", "certificate": cert[0], "private_key": cert[1]}],
        "client_certificate": {"ca": ca, "verify": verify},
        "access_log": True,
    }


def curl_headers(client, url: str, tls_files: tuple[str, str] | None = None) -> dict | None:
    """The headers the echoing backend saw (lowercase names); None if the TLS handshake was refused."""
    argv = ["curl", "-sS", "-k", "--noproxy", "*", "--max-time", "10", url]
    if tls_files is not None:
        argv += ["--cert", tls_files[0], "--key", tls_files[1]]
    result = subprocess.run(["ip", "netns", "exec", client.netns, *argv], capture_output=True, text=True, timeout=20)
    if result.returncode != 0:
        return None
    seen = json.loads(result.stdout.split("\n")[1])
    return {name.lower(): value for name, value in seen["headers"].items()}


def test_mutual_tls_refuses_or_admits_a_client_without_a_certificate_and_each_request_is_logged(
    agent_factory, vpc, prefix, tmp_path
):
    host = vpc.add_host("a", PRIMARY)
    host.start_http("a", echo=True)
    client = vpc.add_host("client", "198.18.0.31")
    authority = Authority()
    cert, key = authority.issue("alice")
    tls_files = (str(tmp_path / "alice.pem"), str(tmp_path / "alice.key"))
    (tmp_path / "alice.pem").write_text(pem_of(cert))
    (tmp_path / "alice.key").write_text(key)
    server_cert = self_signed_certificate("www.example.com")
    ca = pem_of(authority.cert)
    lb_id = f"{prefix}-mtls"
    listeners = [
        https_listener("strict", 443, server_cert, ca, "required"),
        https_listener("lenient", 444, server_cert, ca, "optional"),
    ]
    agent = start_agent(
        agent_factory, vpc, lb_id, loadbalancer(lb_id, VIP, MAC, listeners, {"bg-1": [backend("be-a", PRIMARY)]})
    )

    assert curl_headers(client, f"https://{VIP}:443/") is None
    strict = curl_headers(client, f"https://{VIP}:443/strict", tls_files)
    assert strict is not None and (strict["x-ssl-client-verify"], strict["x-ssl-client-dn"]) == ("0", "/CN=alice")
    lenient = curl_headers(client, f"https://{VIP}:444/lenient")
    assert lenient is not None and lenient["x-ssl-client-verify"] == "none", lenient

    def logged(listener_id: str, path: str) -> bool:
        wanted = (f"lb={lb_id}", f"listener={listener_id}", f"path={path}", "status=200")
        return any(all(w in line.split() for w in wanted) for line in agent.log().splitlines())

    wait_until(lambda: logged("strict", "/strict") and logged("lenient", "/lenient"), 10, "the access lines")
