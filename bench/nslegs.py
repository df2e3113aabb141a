"""P4's reference legs inside a load balancer's namespace: what the same work costs without lbagent's hops.

A request through lbagent enters the load balancer's namespace on its VIP, is
DNATed across a veth pair to haproxy in the host namespace and comes back
through it to reach a backend. These legs put a proxy where the VIP is, in
that namespace, so the client's path through OVN is the same and only
lbagent's own hops are missing:

- `namespace_haproxy_config`: the configuration the agent wrote for the load
  balancer (its global and defaults, its frontends and backends), each
  listener bound on the VIP at `listener port + NS_HAPROXY_OFFSET` and each
  server line aimed at its member's own address instead of INNER's mapped port;
- `nginx_stream_config`: an nginx `stream` proxy (TCP, round robin) on the VIP
  at NGINX_STREAM_PORT over the same members.

Their ports are ones the agent's NAT leaves alone (it maps only the
listeners' ports), so both run beside the agent without taking its traffic.
`InNamespace` starts one of them with `ip netns exec` and always stops it by
its pid.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from types import TracebackType

from devtools.procs import WaitAborted, stop_pid, which

NS_HAPROXY_OFFSET = 8000  # listener 80 is served on VIP:8080 by the namespace's own haproxy
NGINX_STREAM_PORT = 9080
NGINX_STREAM_MODULE = Path("/usr/lib/nginx/modules/ngx_stream_module.so")  # Debian's libnginx-mod-stream

# Lines of the agent's global section that belong to its own haproxy: the
# master process and the runtime socket the agent talks to.
_AGENT_ONLY = re.compile(r"^\s+(master-worker|stats socket)\b")


def namespace_haproxy_config(
    base_cfg: str, lb_cfg: str, *, outer: str, inner: str, vip: str, members: dict[int, str]
) -> str:
    """The agent's configuration of one load balancer, served from its namespace on the VIP.

    `members` maps each INNER port the agent's server lines use to the member
    address:port the namespace's NAT sends it to.
    """
    sections = _sections(base_cfg)
    kept = [
        "\n".join(line for line in section.splitlines() if not _AGENT_ONLY.match(line))
        for section in sections
        if not section.startswith("frontend lbagent_prometheus")  # the agent's metrics, bound on the host
    ]

    def bind(match: re.Match[str]) -> str:
        return f"bind {vip}:{int(match.group(1)) + NS_HAPROXY_OFFSET}"

    def server(match: re.Match[str]) -> str:
        port = int(match.group(2))
        if port not in members:
            raise ValueError(f"server line to {inner}:{port}, a port no member has")
        return f"{match.group(1)}{members[port]}"

    binds = re.subn(rf"\bbind {re.escape(outer)}:(\d+)\b", bind, lb_cfg)
    servers = re.subn(rf"(\bserver \S+ ){re.escape(inner)}:(\d+)\b", server, binds[0])
    if not binds[1] or not servers[1]:
        raise ValueError(f"no bind on {outer} or no server on {inner}: not this load balancer's configuration")
    return "\n\n".join(kept) + "\n\n" + servers[0]


def _sections(cfg: str) -> list[str]:
    """A configuration cut before each section keyword (global, defaults, frontend, ...), comments kept."""
    sections: list[list[str]] = [[]]
    for line in cfg.splitlines():
        if line and not line[0].isspace() and not line.startswith("#") and sections[-1]:
            sections.append([])
        sections[-1].append(line)
    return ["\n".join(lines).strip("\n") for lines in sections if any(line.strip() for line in lines)]


def nginx_stream_config(directory: Path, vip: str, port: int, members: list[str]) -> str:
    """nginx proxying TCP on vip:port to the members in turn, its files under `directory`."""
    servers = "".join(f"        server {member};\n" for member in members)
    return (
        "# Written by the lbagent benchmark for a load balancer's namespace; removed with it.\n"
        f"load_module {NGINX_STREAM_MODULE};\n"
        "worker_processes auto;\n"
        "daemon off;\n"
        f"pid {directory}/nginx.pid;\n"
        f"error_log {directory}/error.log warn;\n"
        "events { worker_connections 4096; }\n"
        "stream {\n"
        "    upstream members {\n"
        f"{servers}"
        "    }\n"
        "    server {\n"
        f"        listen {vip}:{port} reuseport backlog=4096;\n"
        "        proxy_connect_timeout 5s;\n"
        "        proxy_pass members;\n"
        "    }\n"
        "}\n"
    )


def haproxy_argv(config: Path) -> list[str]:
    # -db: in the foreground, one process, so the pid `ip netns exec` leaves is haproxy's own.
    return [which("haproxy") or "haproxy", "-db", "-f", str(config)]


def nginx_argv(directory: Path, config: Path) -> list[str]:
    if not NGINX_STREAM_MODULE.exists():
        raise RuntimeError(f"nginx's stream module is not installed ({NGINX_STREAM_MODULE}: libnginx-mod-stream)")
    return [which("nginx") or "nginx", "-p", str(directory), "-e", str(directory / "error.log"), "-c", str(config)]


class InNamespace:
    """One server started in a network namespace with `ip netns exec`, stopped by its pid on leaving.

    `marker` (its config path) must be in its command line: that is how the
    stop knows the pid is still the process started here.
    """

    def __init__(self, netns: str, argv: list[str], marker: Path, log: Path):
        self.netns, self.argv, self.marker, self.log = netns, argv, marker, log
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> InNamespace:
        with open(self.log, "wb") as err:
            # `ip netns exec` execs the server: this pid is the server's.
            self.proc = subprocess.Popen(
                [which("ip") or "ip", "netns", "exec", self.netns, *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def check_running(self) -> None:
        """WaitAborted (ends a `wait_for` at once) when the server has exited, with its log's end."""
        if self.proc is None or self.proc.poll() is not None:
            raise WaitAborted(f"{self.argv[0]} in {self.netns} exited: {self.log.read_text(errors='replace')[-500:]}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.proc is None:
            return
        stop_pid(self.proc.pid, expect=str(self.marker), what=f"{self.argv[0]} in {self.netns}")
        self.proc.wait(timeout=10)
