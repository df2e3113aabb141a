"""`send_proxy` v2, v2-ssl and v2-ssl-cn put a PROXY protocol v2 header in
front of each backend connection that a real receiver parses: nginx with
`listen ... proxy_protocol` logs the VPC client's own address from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agentproc import wait_until
from helpers import MAC, VIP, wait_bound
from lbstate import backend, desired, loadbalancer, tcp_listener

NGINX_ADDRESS = "198.18.0.21"
VERSIONS = {"v2": 8100, "v2-ssl": 8101, "v2-ssl-cn": 8102}
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
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_proxy_v2_headers_carry_the_client_address_to_nginx(agent_factory, vpc, prefix, nginx):
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-pp2"
    vpc.add_lb_port(lb_id, MAC, VIP)
    agent = agent_factory()
    listeners = [tcp_listener(f"lsn-{version}", port, send_proxy=version) for version, port in VERSIONS.items()]
    lb = loadbalancer(lb_id, VIP, MAC, listeners, {"bg-1": [backend("be-nginx", NGINX_ADDRESS)]})
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
