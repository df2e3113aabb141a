"""`send_proxy` v2, v2-ssl and v2-ssl-cn put a PROXY protocol v2 header in
front of each backend connection that a real receiver parses: nginx with
`listen ... proxy_protocol` logs the VPC client's own address from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devtools.procs import end_process

from agentproc import wait_until
from helpers import MAC, VIP, wait_bound
from lbstate import backend, desired, loadbalancer, tcp_listener

NGINX_ADDRESS = "198.18.0.21"
VERSIONS = {"v2": 8100, "v2-ssl": 8101, "v2-ssl-cn": 8102}
# The same versions to a receiver that reads the raw header (port 8000).
RAW_ADDRESS = "198.18.0.22"
RAW_PORTS = {"v2": 8200, "v2-ssl": 8201, "v2-ssl-cn": 8202}
# Answers, then closes: "v2 <source address> <TLV types, hex, comma-joined>" for a
# PROXY v2 header (TCP over IPv4), "not-v2 <first bytes, hex>" otherwise.
RAW_RECEIVER = """
import socket, struct
SIG = b"\\r\\n\\r\\n\\x00\\r\\nQUIT\\n"
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 8000))
srv.listen(16)
def read(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data
def answer(conn, text):
    conn.sendall(text.encode() + b"\\n")
    conn.shutdown(socket.SHUT_WR)
    while conn.recv(4096):  # the rest, so that the close is no reset
        pass
while True:
    conn, _ = srv.accept()
    with conn:
        conn.settimeout(5)
        try:
            head = read(conn, 16)
            if head[:12] != SIG or head[12] >> 4 != 2 or head[13] != 0x11:
                answer(conn, "not-v2 " + head.hex())
                continue
            body = read(conn, struct.unpack("!H", head[14:16])[0])
            source = socket.inet_ntoa(body[:4])
            tlvs, rest = [], body[12:]
            while len(rest) >= 3:
                size = struct.unpack("!H", rest[1:3])[0]
                tlvs.append("%02x" % rest[0])
                rest = rest[3 + size:]
            answer(conn, "v2 %s %s" % (source, ",".join(tlvs) or "-"))
        except OSError:
            pass
"""
NGINX_CONF = """\
daemon off;
master_process on;
worker_processes 1;
user root;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 64; }}
http {{
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    log_format pp '$proxy_protocol_addr $remote_addr $request_uri';
    access_log {dir}/access.log pp;
    server {{
        listen 8000 proxy_protocol;
        location / {{ return 200 "nginx\\n"; }}
    }}
}}
"""


@pytest.fixture
def nginx(vpc, tmp_path: Path):
    """nginx with a PROXY-protocol listener on port 8000 in a VPC host; its access log's path."""
    host = vpc.add_host("nginx", NGINX_ADDRESS)
    work = tmp_path / "nginx"
    work.mkdir()
    conf = work / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=work))
    log = work / "access.log"
    # `ip netns exec` execs nginx, so this pid is nginx's master process.
    proc = subprocess.Popen(
        ["ip", "netns", "exec", host.netns, "nginx", "-e", str(work / "error.log"), "-p", str(work), "-c", str(conf)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:

        def answers() -> bool:
            assert proc.poll() is None, (work / "error.log").read_text(errors="replace")
            probe = ["curl", "-sS", "--noproxy", "*", "--max-time", "1", "--haproxy-protocol", "http://127.0.0.1:8000/"]
            return host.run(*probe, check=False).strip() == "nginx"

        wait_until(answers, 10, "nginx answering in its namespace")
        yield log
    finally:
        end_process(proc)


# argv: host, port. Sends a line, prints all that comes back before the close.
ASK = (
    "import socket, sys\n"
    "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
    "s.sendall(b'hello, receiver!\\n')\n"  # 16 bytes and more: a probe without a header is answered too
    "data = b''\n"
    "while chunk := s.recv(4096):\n"
    "    data += chunk\n"
    "print(data.decode(errors='replace').strip())\n"
)


@pytest.fixture
def raw_receiver(vpc):
    """RAW_RECEIVER on port 8000 of a VPC host, stopped by its pid afterwards."""
    host = vpc.add_host("raw", RAW_ADDRESS)
    proc = subprocess.Popen(
        ["ip", "netns", "exec", host.netns, sys.executable, "-c", RAW_RECEIVER],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(
            lambda: host.run(sys.executable, "-c", ASK, "127.0.0.1", "8000", check=False).startswith("not-v2"),
            10,
            "the raw PROXY receiver listening",
        )
        yield host
    finally:
        proc.terminate()
        proc.wait(10)


def test_proxy_v2_headers_carry_the_client_address_to_nginx(agent_factory, vpc, prefix, nginx, raw_receiver):
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-pp2"
    vpc.add_lb_port(lb_id, MAC, VIP)
    agent = agent_factory()
    listeners = [tcp_listener(f"lsn-{version}", port, send_proxy=version) for version, port in VERSIONS.items()]
    listeners += [
        tcp_listener(f"raw-{version}", port, group="bg-raw", send_proxy=version) for version, port in RAW_PORTS.items()
    ]
    groups = {"bg-1": [backend("be-nginx", NGINX_ADDRESS)], "bg-raw": [backend("be-raw", RAW_ADDRESS)]}
    lb = loadbalancer(lb_id, VIP, MAC, listeners, groups)
    assert agent.refresh(desired(1, lb))[0] == 200
    wait_bound(agent, lb_id)

    for version, port in VERSIONS.items():
        assert client.curl(f"http://{VIP}:{port}/{version}").strip() == "nginx", version

    def logged() -> dict[str, tuple[str, str]]:
        lines = (line.split() for line in nginx.read_text().splitlines())
        return {uri[1:]: (proxied, peer) for proxied, peer, uri in lines if uri[1:] in VERSIONS}

    seen = wait_until(lambda: len(got := logged()) == len(VERSIONS) and got, 5, "nginx's access log lines")
    for version in VERSIONS:
        proxied, peer = seen[version]
        # The address nginx read from the PROXY header is the client's; the
        # connection itself came from haproxy's side of the load balancer.
        assert proxied == client.ip and peer != client.ip, (version, seen)

    # The header itself is version 2 (nginx would take a v1 line as well), from the client.
    raw = {version: client.run(sys.executable, "-c", ASK, VIP, str(port)) for version, port in RAW_PORTS.items()}
    for answer in raw.values():
        assert answer.split()[:2] == ["v2", client.ip], raw
