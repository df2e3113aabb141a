"""systemd/lbagent.service: what the agent relies on is there, and nothing that would break it."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).parents[2] / "systemd" / "lbagent.service"
# Each of these gives the service a mount namespace of its own, in which the
# bind mounts naming network namespaces (/run/netns/lb-*) would be invisible
# to the host and to the next agent after a restart.
MOUNT_NAMESPACE_OPTIONS = {
    "PrivateTmp",
    "PrivateDevices",
    "PrivateMounts",
    "ProtectSystem",
    "ProtectHome",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectHostname",
    "ProtectProc",
    "ProcSubset",
    "ReadWritePaths",
    "ReadOnlyPaths",
    "InaccessiblePaths",
    "ExecPaths",
    "NoExecPaths",
    "TemporaryFileSystem",
    "BindPaths",
    "BindReadOnlyPaths",
    "RootDirectory",
    "RootImage",
    "MountFlags",
    "MountAPIVFS",
    "DynamicUser",
    "PrivateUsers",
    "RestrictNamespaces",
}


def service_settings() -> dict[str, str]:
    settings, section = {}, None
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings[key] = value
    return settings


def test_lifecycle_settings():
    s = service_settings()
    assert s["Type"] == "notify" and s["NotifyAccess"] == "main"
    assert int(s["WatchdogSec"]) > 0 and s["TimeoutStartSec"] == "infinity"
    assert s["Restart"] == "on-failure"
    assert s["KillMode"] == "process"  # haproxy outlives an agent restart


def test_capabilities_the_agent_needs_are_granted():
    s = service_settings()
    granted = set(s["CapabilityBoundingSet"].split())
    assert {"CAP_NET_ADMIN", "CAP_SYS_ADMIN"} <= granted
    assert "User" not in s  # root: namespaces, netlink, OVS and iptables
    assert {"AF_UNIX", "AF_INET", "AF_NETLINK", "AF_PACKET"} <= set(s["RestrictAddressFamilies"].split())


def test_no_private_mount_namespace():
    assert MOUNT_NAMESPACE_OPTIONS.isdisjoint(service_settings())


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit(tmp_path):
    lbagent = Path(sys.executable).with_name("lbagent")
    unit = tmp_path / "lbagent.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/lbagent", str(lbagent)))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "lbagent.service" not in result.stderr, result.stderr
