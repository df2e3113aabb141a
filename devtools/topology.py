"""A VPC inside an `OvnSandbox`: OVN logical switch + router, and hosts in namespaces.

This module owns every object one `Vpc` creates (logical switches, router,
router ports, logical switch ports, network namespaces, veth pairs, OVS
ports on br-int and the HTTP server processes in the namespaces) and removes
exactly those again. Every name carries the VPC's prefix: namespaces are
`<prefix>-<host>`, host-side links `<prefix><hash6>h` (≤ 15 characters, the
hash of the host name so two hosts never collide), OVN objects `<prefix>-...`.
The only exception is the load balancer port `iface/lb/<id>`, whose name the
agent dictates; it lives on the VPC's switch and goes with it.

What was created is recorded before it is created, optionally in a JSON
file, so that `cleanup()` works after a partial failure and from another
process (`Vpc.restore`, used by `demo down`).

The VPC's OVN objects go into any northbound database with an `nbctl`
(`OvnNorthbound`: the sandbox, or a multi-host central), and its hosts onto
any `Hypervisor`: by default the sandbox's own OVS in the host namespace; a
simulated host of `devtools.multihost` runs the same commands through its
`launcher` (a command prefix that enters its namespaces).

Addresses must lie in 198.18.0.0/15, the benchmarking range, and IPv6 ones
in 2001:db8::/32, the documentation prefix: both routed nowhere on the test
machines. A subnet may have an IPv6 prefix as well (`cidr6`, `gateway6`): its
hosts and load balancer ports then carry both addresses.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import json
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from devtools.programs import HTTPD_CODE, HTTPD_MARKER, PING_CODE, self_signed_certificate
from devtools.sandbox import (
    INTEGRATION_BRIDGE,
    CommandError,
    WaitAborted,
    link_names,
    run,
    stop_pid,
    wait_for,
    which,
)

# CommandError is re-exported: VpcHost.run/curl raise it; so is self_signed_certificate,
# which the tests import from here.
__all__ = [
    "ALLOWED_RANGE",
    "ALLOWED_RANGE6",
    "CommandError",
    "Hypervisor",
    "OvnNorthbound",
    "OvsDatabase",
    "Vpc",
    "VpcHost",
    "lb_port_name",
    "self_signed_certificate",
]

ALLOWED_RANGE = ipaddress.IPv4Network("198.18.0.0/15")
ALLOWED_RANGE6 = ipaddress.IPv6Network("2001:db8::/32")
PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
ROUTER_MAC = "00:00:5e:00:53:01"  # RFC 7042 documentation MAC range
NS_IFNAME = "eth0"


@runtime_checkable
class OvnNorthbound(Protocol):
    """The northbound database a VPC's switches, router and ports go into."""

    def nbctl(self, *args: str, timeout: float = 30) -> str: ...

    def nb_db_running(self) -> bool: ...


@runtime_checkable
class OvsDatabase(Protocol):
    """An Open_vSwitch database whose br-int the VPC's hosts are plugged into."""

    def vsctl(self, *args: str, timeout: float = 30) -> str: ...

    def ovs_db_running(self) -> bool: ...


class Hypervisor(OvsDatabase, Protocol):
    """A machine VPC hosts live on: its OVS, and how to run a command there."""

    @property
    def launcher(self) -> Sequence[str]:
        """Prefix that runs a command on it (empty: right here)."""
        ...


@dataclass(frozen=True)
class _LocalHypervisor:
    """The sandbox's OVS, in the namespaces of the calling process."""

    ovs: OvsDatabase
    launcher: tuple[str, ...] = ()

    def vsctl(self, *args: str, timeout: float = 30) -> str:
        return self.ovs.vsctl(*args, timeout=timeout)

    def ovs_db_running(self) -> bool:
        return self.ovs.ovs_db_running()


def lb_port_name(lb_id: str) -> str:
    """The logical switch port the agent binds a load balancer to."""
    return f"iface/lb/{lb_id}"


def _check_in_range(
    value: ipaddress.IPv4Address | ipaddress.IPv4Network | ipaddress.IPv6Address | ipaddress.IPv6Network, what: str
) -> None:
    allowed = ALLOWED_RANGE if value.version == 4 else ALLOWED_RANGE6
    if isinstance(value, ipaddress.IPv4Network | ipaddress.IPv6Network):
        inside = value.subnet_of(allowed)  # type: ignore[arg-type]  # same family, checked above
    else:
        inside = value in allowed
    if not inside:
        raise ValueError(f"{what} {value} is outside {allowed}: test addresses must stay in it")


def _parse_subnet(cidr: str, gateway: str) -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Address]:
    net, gw = ipaddress.IPv4Network(cidr), ipaddress.IPv4Address(gateway)
    _check_in_range(net, "subnet")
    if gw not in net:
        raise ValueError(f"gateway {gw} is not in {net}")
    return net, gw


def _parse_subnet6(cidr6: str, gateway6: str) -> tuple[ipaddress.IPv6Network, ipaddress.IPv6Address] | None:
    """The subnet's IPv6 prefix and gateway; None for a subnet without (both empty)."""
    if not cidr6 and not gateway6:
        return None
    if not cidr6 or not gateway6:
        raise ValueError("an IPv6 subnet needs both cidr6 and gateway6")
    net, gw = ipaddress.IPv6Network(cidr6), ipaddress.IPv6Address(gateway6)
    _check_in_range(net, "subnet")
    if gw not in net:
        raise ValueError(f"gateway {gw} is not in {net}")
    return net, gw


def _address_in(ip: str, cidr: str, what: str) -> str:
    """`ip` in canonical form, refused unless inside the test ranges and `cidr`."""
    addr = ipaddress.ip_address(ip)
    _check_in_range(addr, what)
    if not cidr or addr not in ipaddress.ip_network(cidr):
        raise ValueError(f"{what} {addr} is not in subnet {cidr or '(the subnet has no IPv6 prefix)'}")
    return str(addr)


@dataclass
class _Subnet:
    cidr: str
    gateway: str
    switch: str
    router_port: str
    switch_router_port: str
    cidr6: str = ""
    gateway6: str = ""

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_network(self.cidr).prefixlen

    @property
    def prefixlen6(self) -> int:
        return ipaddress.ip_network(self.cidr6).prefixlen


@dataclass
class VpcHost:
    """A namespace plugged into the VPC, optionally running an HTTP server."""

    name: str
    netns: str
    ip: str
    mac: str
    lsp: str
    host_if: str
    subnet: int = 0
    ip6: str = ""  # "": IPv4 only
    http_port: int | None = None
    http_pid: int | None = None
    hypervisor: str = ""  # key of the Vpc's hypervisor it lives on ("": the sandbox)
    launcher: list[str] = field(default_factory=list)  # that hypervisor's command prefix
    _proc: subprocess.Popen | None = field(default=None, repr=False, compare=False)

    def run(self, *cmd: str, timeout: float = 30, check: bool = True) -> str:
        """Run a command inside the host's namespace; return stdout."""
        return run(*self.launcher, "ip", "netns", "exec", self.netns, *cmd, timeout=timeout, check=check)

    def curl(self, url: str, timeout: float = 5) -> str:
        """GET `url` from inside the namespace; return the body (CommandError on failure)."""
        # --noproxy: an http_proxy in the environment must not divert VPC traffic;
        # --globoff: the brackets of an IPv6 URL are the address, not a pattern.
        return self.run(
            "curl", "-sS", "--fail", "--globoff", "--noproxy", "*", "--max-time", str(timeout), url, timeout=timeout + 5
        )

    def ping(self, ip: str, timeout: float = 5) -> str:
        """Ping until one reply arrives (the first may wait for ARP) or `timeout` passes."""
        return self.run(sys.executable, "-c", PING_CODE, ip, str(timeout), timeout=timeout + 5)

    def start_http(
        self,
        text: str,
        port: int = 8000,
        timeout: float = 10,
        *,
        echo: bool = False,
        set_cookie: str | None = None,
        proxy_protocol: bool = False,
        tls: tuple[str, str] | None = None,
        http11: bool = False,
    ) -> None:
        """Start the HTTP server answering `text` + newline; return once it answers.

        The keyword options are HTTPD_CODE's (all off: a plain HTTP server);
        `tls` is (certificate file, key file).
        """
        self.stop_http()
        options = {
            "echo": echo,
            "set_cookie": set_cookie,
            "proxy_protocol": proxy_protocol,
            "tls": list(tls) if tls else None,
            "http11": http11,
        }
        argv = [sys.executable, "-c", HTTPD_CODE, text, str(port)]
        if any(options.values()):
            argv.append(json.dumps({key: value for key, value in options.items() if value}))
        self._proc = subprocess.Popen(
            [*self.launcher, which("ip") or "ip", "netns", "exec", self.netns, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own session: a Ctrl-C meant for the test runner must not
            # take it down mid-test, and the demo's servers outlive `up`.
            start_new_session=True,
        )
        # `ip netns exec` execs the command (as does a launcher's nsenter), so
        # this pid is the server itself.
        self.http_pid, self.http_port = self._proc.pid, port

        def answers() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                raise WaitAborted(f"HTTP server in {self.netns} exited with {self._proc.returncode}")
            probe = ["curl", "-sS", "--fail", "--noproxy", "*", "--max-time", "1", "-k"]
            if proxy_protocol:
                probe.append("--haproxy-protocol")
            url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/"
            return self.run(*probe, url, timeout=6).split("\n")[0] == text

        wait_for(answers, timeout, f"HTTP server in {self.netns} on port {port}")

    def stop_http(self) -> None:
        if self.http_pid is not None:
            stop_pid(self.http_pid, expect=HTTPD_MARKER, what=f"HTTP server in {self.netns}")
        if self._proc is not None:
            self._proc.wait(timeout=5)  # reap it: we are its parent
            self._proc = None
        self.http_pid = None

    def record(self) -> dict[str, Any]:
        """The persistent fields (not the Popen handle, which only this process can use)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


class Vpc:
    """One VPC: switch `<prefix>-ls` + router `<prefix>-lr` with the gateway address.

    Construction creates the OVN objects (and removes them again if that
    fails). `state_file`, when given, receives the record of everything
    created, for `Vpc.restore`. `hypervisors` names the machines `add_host`
    may put hosts on (`on=`); by default the one machine is the sandbox
    itself, under the name "".
    """

    def __init__(
        self,
        sandbox: OvnNorthbound,
        prefix: str,
        cidr: str = "198.18.0.0/24",
        gateway: str = "198.18.0.1",
        *,
        cidr6: str = "",
        gateway6: str = "",
        state_file: Path | None = None,
        hypervisors: Mapping[str, Hypervisor] | None = None,
        _record: dict[str, Any] | None = None,
    ):
        if not PREFIX_RE.match(prefix):
            raise ValueError(
                f"prefix {prefix!r} must be 1-8 of [a-z0-9], starting with a letter "
                "(it goes into 15-character interface names)"
            )
        self.sandbox = sandbox
        self.hypervisors = _hypervisors(sandbox, hypervisors)
        self.prefix = prefix
        self.router = f"{prefix}-lr"
        self.state_file = Path(state_file) if state_file else None
        self.subnets: list[_Subnet] = []
        self.hosts: dict[str, VpcHost] = {}
        self.lb_ports: dict[str, str] = {}  # lb id -> switch name
        if _record is not None:
            self._load(_record)
            return
        _parse_subnet(cidr, gateway)  # refuse bad addresses before creating anything
        _parse_subnet6(cidr6, gateway6)
        try:
            self._save()
            self.sandbox.nbctl("lr-add", self.router)
            self.add_subnet(cidr, gateway, cidr6, gateway6)
        except BaseException:
            self.cleanup()
            raise

    # -- persistence ---------------------------------------------------------

    @classmethod
    def restore(
        cls, sandbox: OvnNorthbound, state_file: Path, hypervisors: Mapping[str, Hypervisor] | None = None
    ) -> Vpc:
        """Rebuild a Vpc from its state file (e.g. to clean it up from another process)."""
        record = json.loads(Path(state_file).read_text())
        return cls(sandbox, record["prefix"], state_file=state_file, hypervisors=hypervisors, _record=record)

    def _load(self, record: dict[str, Any]) -> None:
        self.subnets = [_Subnet(**s) for s in record.get("subnets", [])]
        self.hosts = {h["name"]: VpcHost(**h) for h in record.get("hosts", [])}
        self.lb_ports = dict(record.get("lb_ports", {}))

    def _save(self) -> None:
        if self.state_file is None:
            return
        record = {
            "prefix": self.prefix,
            "subnets": [asdict(s) for s in self.subnets],
            "hosts": [h.record() for h in self.hosts.values()],
            "lb_ports": self.lb_ports,
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(self.state_file)

    # -- OVN -----------------------------------------------------------------

    @property
    def switch(self) -> str:
        """The first subnet's logical switch."""
        return self.subnets[0].switch

    @property
    def cidr(self) -> str:
        return self.subnets[0].cidr

    @property
    def gateway(self) -> str:
        return self.subnets[0].gateway

    def add_subnet(self, cidr: str, gateway: str, cidr6: str = "", gateway6: str = "") -> int:
        """Add a switch for `cidr` (and `cidr6`) attached to the router; return the subnet's index."""
        net, gw = _parse_subnet(cidr, gateway)
        v6 = _parse_subnet6(cidr6, gateway6)
        networks = [f"{gw}/{net.prefixlen}"] + ([f"{v6[1]}/{v6[0].prefixlen}"] if v6 else [])
        index = len(self.subnets)
        suffix = "" if index == 0 else str(index)
        subnet = _Subnet(
            cidr=str(net),
            gateway=str(gw),
            switch=f"{self.prefix}-ls{suffix}",
            router_port=f"{self.prefix}-lrp{index}",
            switch_router_port=f"{self.prefix}-ls{suffix}-rp",
            cidr6=str(v6[0]) if v6 else "",
            gateway6=str(v6[1]) if v6 else "",
        )
        self.subnets.append(subnet)
        self._save()
        mac = ROUTER_MAC[:-2] + f"{index + 1:02x}"
        self.sandbox.nbctl(
            "ls-add",
            subnet.switch,
            "--",
            "lrp-add",
            self.router,
            subnet.router_port,
            mac,
            *networks,
            "--",
            "lsp-add",
            subnet.switch,
            subnet.switch_router_port,
            "--",
            "lsp-set-type",
            subnet.switch_router_port,
            "router",
            "--",
            "lsp-set-addresses",
            subnet.switch_router_port,
            "router",
            "--",
            "lsp-set-options",
            subnet.switch_router_port,
            f"router-port={subnet.router_port}",
        )
        return index

    def add_lb_port(self, lb_id: str, mac: str, ip: str, subnet: int = 0, ip6: str = "") -> str:
        """Create the LSP `iface/lb/<lb_id>` the agent's load balancer binds to; return its name.
        With `ip6` the port carries both addresses."""
        _check_in_range(ipaddress.IPv4Address(ip), "load balancer address")
        addresses = f"{mac} {ip}"
        if ip6:
            addresses += " " + _address_in(ip6, self.subnets[subnet].cidr6, "load balancer address")
        name = lb_port_name(lb_id)
        self.lb_ports[lb_id] = self.subnets[subnet].switch
        self._save()
        self.sandbox.nbctl("lsp-add", self.subnets[subnet].switch, name, "--", "lsp-set-addresses", name, addresses)
        return name

    def del_lb_port(self, lb_id: str) -> None:
        self.sandbox.nbctl("--if-exists", "lsp-del", lb_port_name(lb_id))
        self.lb_ports.pop(lb_id, None)
        self._save()

    # -- hosts ---------------------------------------------------------------

    def add_host(
        self,
        name: str,
        ip: str,
        mac: str | None = None,
        http_text: str | None = None,
        http_port: int = 8000,
        subnet: int = 0,
        timeout: float = 30,
        on: str = "",
        ip6: str = "",
    ) -> VpcHost:
        """A namespace `<prefix>-<name>` on the VPC, bound through OVN, optionally serving HTTP.

        `on` names the hypervisor it lives on (one of `hypervisors`); `ip6`, an
        address in the subnet's `cidr6`, makes it dual-stack.
        """
        if name in self.hosts:
            raise ValueError(f"host {name!r} already exists in VPC {self.prefix}")
        if on not in self.hypervisors:
            raise ValueError(f"no hypervisor {on!r} for host {name!r}; known: {sorted(self.hypervisors)}")
        net = self.subnets[subnet]
        addr = ipaddress.IPv4Address(ip)
        _check_in_range(addr, "host address")
        if addr not in ipaddress.ip_network(net.cidr):
            raise ValueError(f"{addr} is not in subnet {net.cidr}")
        ip6 = _address_in(ip6, net.cidr6, "host address") if ip6 else ""
        digest = hashlib.sha1(f"{self.prefix}-{name}".encode()).hexdigest()[:6]
        host = VpcHost(
            name=name,
            netns=f"{self.prefix}-{name}",
            ip=str(addr),
            mac=mac or _mac_for(addr),
            lsp=f"{self.prefix}-{name}",
            host_if=f"{self.prefix}{digest}h",
            subnet=subnet,
            ip6=ip6,
            hypervisor=on,
            launcher=list(self.hypervisors[on].launcher),
        )
        self.hosts[name] = host
        self._save()  # before creating anything, so cleanup() knows what to look for
        self._plumb(host, net)
        self._bind(host, net, timeout)
        if http_text is not None:
            host.start_http(http_text, http_port)
            self._save()
        return host

    def _plumb(self, host: VpcHost, net: _Subnet) -> None:
        """Namespace, veth pair (namespace end created directly inside it), addresses, route."""
        on = host.launcher
        run(*on, "ip", "netns", "add", host.netns)
        run(*on, "ip", "link", "add", host.host_if, "type", "veth", "peer", "name", NS_IFNAME, "netns", host.netns)
        ns = (*on, "ip", "-n", host.netns)
        run(*ns, "link", "set", NS_IFNAME, "address", host.mac)
        run(*ns, "addr", "add", f"{host.ip}/{net.prefixlen}", "dev", NS_IFNAME)
        run(*ns, "link", "set", "lo", "up")
        run(*ns, "link", "set", NS_IFNAME, "up")
        run(*ns, "route", "add", "default", "via", net.gateway)
        if host.ip6:
            # nodad: the address is usable at once, not after duplicate address detection.
            run(*ns, "addr", "add", f"{host.ip6}/{net.prefixlen6}", "dev", NS_IFNAME, "nodad")
            run(*ns, "-6", "route", "add", "default", "via", net.gateway6, "dev", NS_IFNAME)
        # The userspace datapath delivers frames as the sender left them: with
        # TX checksum offload on, TCP segments arrive with bad checksums and are
        # dropped (ping still works). Checksums must be computed in software.
        run(*on, "ip", "netns", "exec", host.netns, "ethtool", "-K", NS_IFNAME, "tx", "off")
        run(*on, "ip", "link", "set", host.host_if, "up")

    def _bind(self, host: VpcHost, net: _Subnet, timeout: float) -> None:
        """LSP with the host's addresses, OVS port with its iface-id; wait for ovn-installed."""
        addresses = " ".join(a for a in (host.mac, host.ip, host.ip6) if a)
        self.sandbox.nbctl("lsp-add", net.switch, host.lsp, "--", "lsp-set-addresses", host.lsp, addresses)
        ovs = self.hypervisors[host.hypervisor]
        ovs.vsctl(
            "add-port",
            INTEGRATION_BRIDGE,
            host.host_if,
            "--",
            "set",
            "Interface",
            host.host_if,
            f"external_ids:iface-id={host.lsp}",
        )
        wait_for(
            lambda: (
                ovs.vsctl("--if-exists", "get", "Interface", host.host_if, "external_ids:ovn-installed").strip()
                == '"true"'
            ),
            timeout,
            f"ovn-installed=true on {host.host_if} ({host.lsp})",
        )

    # -- teardown ------------------------------------------------------------

    def cleanup(self, ovs_timeout: float = 30.0) -> None:
        """Remove everything this VPC created. Idempotent; tolerant of partial state.

        Keeps going past individual failures and raises one error listing
        them at the end, so leaks are never silent. `ovs_timeout`: how long a
        port deletion waits for ovs-vswitchd, which after thousands of ports
        went takes minutes to catch up.
        """
        errors: list[str] = []

        def attempt(what: str, fn, *args) -> None:
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - collected and raised below
                errors.append(f"{what}: {exc}")

        # A database whose server is gone took its rows with it (and would
        # only make the ctl commands wait for their timeout).
        nb_up = self.sandbox.nb_db_running()
        for host in list(self.hosts.values()):
            attempt(f"HTTP server of {host.name}", host.stop_http)
            ovs = self.hypervisors.get(host.hypervisor)
            if ovs is not None and ovs.ovs_db_running():
                attempt(
                    f"OVS port {host.host_if}",
                    functools.partial(ovs.vsctl, timeout=ovs_timeout),
                    "--if-exists",
                    "del-port",
                    INTEGRATION_BRIDGE,
                    host.host_if,
                )
            attempt(f"link {host.host_if}", _del_link, host.host_if, host.launcher)
            attempt(f"netns {host.netns}", _del_netns, host.netns, host.launcher)
        ovn_cmd: list[str] = []
        for lb_id in self.lb_ports:
            ovn_cmd += ["--", "--if-exists", "lsp-del", lb_port_name(lb_id)]
        for host in self.hosts.values():
            ovn_cmd += ["--", "--if-exists", "lsp-del", host.lsp]
        for net in self.subnets:
            ovn_cmd += ["--", "--if-exists", "ls-del", net.switch]
        ovn_cmd += ["--", "--if-exists", "lr-del", self.router]
        if nb_up:
            attempt("OVN objects", self.sandbox.nbctl, *ovn_cmd)
        if errors:
            self._save()
            raise RuntimeError(f"VPC {self.prefix} cleanup incomplete: " + "; ".join(errors))
        self.hosts.clear()
        self.lb_ports.clear()
        self.subnets.clear()
        if self.state_file is not None:
            self.state_file.unlink(missing_ok=True)


def _mac_for(addr: ipaddress.IPv4Address) -> str:
    """A locally administered unicast MAC carrying the address (0a:58 as ovn-kubernetes does)."""
    return "0a:58:" + ":".join(f"{b:02x}" for b in addr.packed)


def _hypervisors(sandbox: OvnNorthbound, given: Mapping[str, Hypervisor] | None) -> dict[str, Hypervisor]:
    if given is not None:
        return dict(given)
    if not isinstance(sandbox, OvsDatabase):
        raise TypeError(f"{type(sandbox).__name__} has no OVS of its own: pass the hypervisors")
    return {"": _LocalHypervisor(sandbox)}


def _del_link(name: str, launcher: Sequence[str] = ()) -> None:
    if name in link_names(*launcher):
        run(*launcher, "ip", "link", "del", name)


def _del_netns(name: str, launcher: Sequence[str] = ()) -> None:
    if name not in run(*launcher, "ip", "netns", "list").split():
        return
    # Whatever still runs in a namespace we created was started by us (a
    # server whose pid never got recorded): it would keep the namespace's
    # network alive after `ip netns del`.
    for pid in run(*launcher, "ip", "netns", "pids", name).split():
        stop_pid(int(pid), expect="", what=f"process {pid} left in netns {name}")
    run(*launcher, "ip", "netns", "del", name)
