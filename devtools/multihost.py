"""Several simulated OVN hosts and one OVN central on this one machine, for tests, the benchmark and the demo.

This module owns the whole of one multi-host sandbox: its names and address
plan, the underlay that joins the hosts and the central, the order things
start and stop in, the record of what was made (`<base>/multihost.json`,
written before each thing is made, so that `stop()` works after a partial
start and `MultiHost.restore(base).stop()` from another process), and the
VPCs built on it. The hosts and the central themselves are
`devtools.simhost`'s and `devtools.central`'s.

How it is laid out, for `MultiHost(base, "t1", ["gw-1", "gw-2", "cl"])`:

- network namespaces (the machine's /run/netns): `t1-ul` with the Linux
  bridge `br-ul` (the underlay, 198.19.255.0/24), `t1-c` for the central
  (198.19.255.1), `t1-h-<name>` for each host (198.19.255.11, .12, ... in
  the order given). Each host and the central reach `br-ul` through a veth,
  `ul0` on their side, `h-<name>` (or `c`) on the bridge.
- the central: NB (a one-member RAFT cluster: `ptcp:6641:198.19.255.1`, its
  raft port 6643), SB (`ptcp:6642:198.19.255.1`), both also on unix sockets
  in `<base>/central/run` for the test process (`central.nbctl`, `nb_db`),
  and ovn-northd. Hosts reach them over the underlay only, so cutting a
  host's underlay cuts it from NB and SB as well as from the other hosts.
- each host: its own ovsdb-server, ovs-vswitchd (userspace datapath, inside
  the host's namespace, so `ovs-netdev` and the bridges' taps live there) and
  ovn-controller, with `<base>/hosts/<name>/{run,db,log,etc}`; chassis name
  `t1-<name>`; Geneve from the address on `br-phy`'s own device, `br-phy`
  having `ul0` as its port; one persistent mount namespace
  (`<base>/mnt/<name>`) that every process of the host runs in, where
  /run/netns is `<base>/hosts/<name>/netns`: a namespace a host's agent
  creates there is that host's alone, and two hosts may each have one of the
  same name.
- `vpc()`: a logical router and switch in the central's NB (prefix `t1` + a
  digit); its hosts are namespaces inside a simulated host, plugged into that
  host's br-int (`add_host(..., on="cl")`).

The machine's network namespace gets no device at all, so a multi-host
sandbox never collides with the single-host `OvnSandbox` (whose lock and
`ovs-netdev` check it neither takes nor trips) nor with another multi-host
sandbox of a different prefix: all of them can run at once.

`ovn-nbctl --wait=hv` waits for every chassis in SB, a crashed host's
included: while a host is down, wait on its peers' own signals instead.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from devtools.central import Central
from devtools.namespaces import Ledger, MultiHostError, add_netns, del_netns, unmount
from devtools.procs import CommandError, run
from devtools.simhost import UNDERLAY_MTU, UPLINK, HostPlan, SimHost
from devtools.topology import Vpc

__all__ = ["Central", "MultiHost", "MultiHostError", "SimHost", "underlay_plan"]

UNDERLAY = ipaddress.IPv4Network("198.19.255.0/24")
CENTRAL_HOST_NUMBER, FIRST_HOST_NUMBER = 1, 11
UNDERLAY_BRIDGE = "br-ul"
CENTRAL_PEER = "c"
RECORD = "multihost.json"
# The prefix goes into VPC prefixes (1-8 characters) with one more digit.
PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,6}$")
HOST_RE = re.compile(r"^[a-z][a-z0-9-]{0,11}$")
UNIX_PATH_MAX = 107
# The longest socket name a host's run directory gets: ovn-controller.<pid>.ctl.
LONGEST_SOCKET = "ovn-controller.4194304.ctl"


def underlay_plan(hosts: list[str]) -> tuple[str, dict[str, str]]:
    """(central's address, {host: address}) on the underlay, hosts numbered from .11 in order."""
    central = str(UNDERLAY.network_address + CENTRAL_HOST_NUMBER)
    last = UNDERLAY.num_addresses - 2 - FIRST_HOST_NUMBER
    if len(hosts) > last + 1:
        raise ValueError(f"at most {last + 1} hosts fit in the underlay {UNDERLAY}, not {len(hosts)}")
    return central, {h: str(UNDERLAY.network_address + FIRST_HOST_NUMBER + i) for i, h in enumerate(hosts)}


def host_peer_name(host: str) -> str:
    """The underlay end of a host's veth, on br-ul."""
    return f"h-{host}"


def check_names(base_dir: Path, prefix: str, hosts: list[str]) -> None:
    """Refuse names that would not fit where they go (interface names, socket paths)."""
    if not PREFIX_RE.match(prefix):
        raise ValueError(f"prefix {prefix!r} must be 1-7 of [a-z0-9], starting with a letter")
    if not hosts or len(set(hosts)) != len(hosts):
        raise ValueError(f"hosts must be one or more distinct names, not {hosts}")
    for host in hosts:
        if not HOST_RE.match(host):
            raise ValueError(f"host name {host!r} must be 1-12 of [a-z0-9-], starting with a letter")
        socket = base_dir / "hosts" / host / "run" / LONGEST_SOCKET
        if len(str(socket)) > UNIX_PATH_MAX:
            raise ValueError(f"base directory {base_dir} is too long for the unix socket {socket}")


class MultiHost:
    """One OVN central and simulated hosts `hosts` under `base_dir`; a context manager.

    `start()` brings everything up and waits until every chassis is in SB
    with its encap and a NB change has reached every host; on failure it
    stops what it started. `stop()` removes everything, idempotently.
    """

    def __init__(self, base_dir: Path | str, prefix: str, hosts: list[str], *, _ledger: Ledger | None = None):
        self.base_dir = Path(base_dir).absolute()
        check_names(self.base_dir, prefix, hosts)
        self.prefix = prefix
        self.underlay_netns = f"{prefix}-ul"
        self._ledger = _ledger or Ledger(self.base_dir / RECORD, prefix=prefix, hosts=list(hosts))
        central_ip, host_ips = underlay_plan(hosts)
        self.central = Central(self.base_dir / "central", f"{prefix}-c", central_ip)
        self.mount_dir = self.base_dir / "mnt"
        self.hosts: dict[str, SimHost] = {name: self._sim_host(name, host_ips[name]) for name in hosts}

    def _sim_host(self, name: str, ip: str) -> SimHost:
        plan = HostPlan(
            name=name,
            base=self.base_dir / "hosts" / name,
            netns=f"{self.prefix}-h-{name}",
            mount_file=self.mount_dir / name,
            chassis=f"{self.prefix}-{name}",
            underlay_ip=ip,
            underlay_prefixlen=UNDERLAY.prefixlen,
            underlay_netns=self.underlay_netns,
            underlay_peer=host_peer_name(name),
        )
        return SimHost(plan, self.central, self._ledger)

    @classmethod
    def restore(cls, base_dir: Path | str) -> MultiHost:
        """The sandbox recorded in `base_dir` (e.g. to stop it from another process)."""
        ledger = Ledger.load(Path(base_dir).absolute() / RECORD)
        return cls(base_dir, ledger.prefix, ledger.hosts, _ledger=ledger)

    def host(self, name: str) -> SimHost:
        return self.hosts[name]

    def __enter__(self) -> MultiHost:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- start -----------------------------------------------------------------

    def start(self, timeout: float = 60) -> None:
        try:
            self.base_dir.mkdir(parents=True, exist_ok=True)
            self._ledger.save()
            self._make_underlay()
            self._make_private_mount_dir()
            add_netns(self.central.netns, self._ledger)
            self._attach(self.central.netns, CENTRAL_PEER)
            self._netns_run(
                self.central.netns, "ip", "addr", "add", f"{self.central.ip}/{UNDERLAY.prefixlen}", "dev", UPLINK
            )
            self.central.start()
            for host in self.hosts.values():
                host.make_namespaces()
                self._attach(host.netns, host_peer_name(host.name))
                host.start_daemons()
            for host in self.hosts.values():
                host.wait_ready(timeout)
            # A full round trip NB -> northd -> SB -> every ovn-controller.
            self.central.nbctl("--wait=hv", "sync", timeout=timeout)
        except Exception as exc:
            tails = self.logs()  # stop() removes the logs with the directories
            self.stop()
            raise MultiHostError(f"multi-host sandbox did not start: {exc}{tails}") from exc
        except BaseException:
            self.stop()
            raise

    def _make_underlay(self) -> None:
        add_netns(self.underlay_netns, self._ledger)
        ul = ("ip", "-n", self.underlay_netns)
        run(*ul, "link", "add", UNDERLAY_BRIDGE, "type", "bridge")
        run(*ul, "link", "set", UNDERLAY_BRIDGE, "up")

    def _make_private_mount_dir(self) -> None:
        # `unshare --mount=<file>` binds the new namespace onto <file>, which
        # the kernel refuses on a shared mount (it would propagate into the
        # namespace itself): the files live on a private bind mount of their own.
        self.mount_dir.mkdir(parents=True, exist_ok=True)
        self._ledger.add("mounts", str(self.mount_dir))
        run("mount", "--bind", self.mount_dir, self.mount_dir)
        run("mount", "--make-private", self.mount_dir)

    def _attach(self, netns: str, peer: str) -> None:
        """A veth from `netns` (`ul0`) to the underlay bridge (`peer`), both ends made in place."""
        ul = ("ip", "-n", self.underlay_netns)
        run(*ul, "link", "add", peer, "mtu", str(UNDERLAY_MTU), "type", "veth", "peer", "name", UPLINK, "netns", netns)
        run(*ul, "link", "set", peer, "master", UNDERLAY_BRIDGE, "up")
        run("ip", "-n", netns, "link", "set", UPLINK, "mtu", str(UNDERLAY_MTU), "up")
        # A frame from a kernel sender crosses veths and the bridge with its
        # checksum left to "hardware"; read by a userspace ovs-vswitchd it
        # arrives broken (TCP hangs, ping works). Checksums in software.
        self._netns_run(self.underlay_netns, "ethtool", "-K", peer, "tx", "off")
        self._netns_run(netns, "ethtool", "-K", UPLINK, "tx", "off")

    @staticmethod
    def _netns_run(netns: str, *argv: str) -> str:
        return run("ip", "netns", "exec", netns, *argv)

    # -- VPCs -----------------------------------------------------------------

    def vpc(self, cidr: str = "198.18.0.0/24", gateway: str = "198.18.0.1") -> Vpc:
        """A VPC in the central's NB whose hosts live on the simulated hosts (`add_host(..., on=<host>)`)."""
        index = len(self._ledger.vpcs)
        if index > 9:
            raise MultiHostError("at most 10 VPCs per multi-host sandbox")
        state_file = self.base_dir / f"vpc{index}.json"
        self._ledger.add("vpcs", str(state_file))
        return Vpc(self.central, f"{self.prefix}{index}", cidr, gateway, state_file=state_file, hypervisors=self.hosts)

    def _recorded_vpcs(self) -> Iterator[Vpc]:
        """The VPCs to clean up one by one: with the central down, their objects go with the hosts."""
        for state_file in list(self._ledger.vpcs):
            if Path(state_file).exists() and self.central.nb_db_running():
                yield Vpc.restore(self.central, Path(state_file), hypervisors=self.hosts)
            Path(state_file).unlink(missing_ok=True)
            self._ledger.discard("vpcs", state_file)

    # -- stop ------------------------------------------------------------------

    def stop(self) -> None:
        """Remove everything that was made: processes (by pid), namespaces, devices, mounts, directories.

        Idempotent, safe after a partial start and from another process
        (`restore`). Raises after doing everything it can if something stayed.
        """
        errors: list[str] = []
        try:
            for vpc in self._recorded_vpcs():
                try:
                    vpc.cleanup()
                except RuntimeError as exc:
                    errors.append(str(exc))
        except (OSError, ValueError) as exc:
            errors.append(f"VPC records: {exc}")
        for host in self.hosts.values():
            host.stop(errors)
        self.central.stop(errors)
        for netns in [self.central.netns, self.underlay_netns]:
            try:
                del_netns(netns, self._ledger)
            except CommandError as exc:
                errors.append(str(exc))
        for mount in reversed(list(self._ledger.mounts)):
            unmount(Path(mount), self._ledger, errors)
        if errors:
            raise MultiHostError("multi-host sandbox stop incomplete: " + "; ".join(errors))
        self._remove_dirs()

    def _remove_dirs(self) -> None:
        for path in [self.mount_dir, self.base_dir / "hosts", self.central.base]:
            shutil.rmtree(path, ignore_errors=True)
        for suffix in ("", ".tmp"):
            (self.base_dir / (RECORD + suffix)).unlink(missing_ok=True)

    def logs(self, lines: int = 20) -> str:
        """Tails of every daemon log, for failure messages."""
        return self.central.logs(lines) + "".join(h.logs(lines) for h in self.hosts.values())
