"""A read of the Northbound replica: what it can tell while the IDL monitors, and while it reconnects."""

from types import SimpleNamespace

from lbagent.ovnhost.northbound import PortLease, PortsRead, _ReadPorts


class Idl:
    IDL_S_MONITORING = "monitoring"

    def __init__(self, state: str, covered: frozenset[str] | None, ports: dict[str, PortLease]):
        self.state, self._covered, self._ports = state, covered, ports

    def covered(self):
        return self._covered

    def port(self, name):
        return self._ports.get(name)


def read(idl: Idl, names: list[str]) -> PortsRead:
    command = _ReadPorts(SimpleNamespace(idl=idl), names)
    command.run_idl(None)
    return command.result


def test_a_monitoring_replica_tells_found_absent_and_not_yet_watched():
    port = PortLease("a")
    idl = Idl(Idl.IDL_S_MONITORING, frozenset({"a", "b"}), {"a": port})
    assert read(idl, ["a", "b", "c"]) == PortsRead({"a": port}, frozenset({"c"}))  # b: watched and absent
    everything = Idl(Idl.IDL_S_MONITORING, None, {"a": port})
    assert read(everything, ["a", "b"]) == PortsRead({"a": port}, frozenset())


def test_while_reconnecting_no_port_is_told_absent():
    # The condition is taken as answered before the server's new copy of the rows is in.
    idl = Idl("monitor-cond-requested", frozenset({"a", "b"}), {"a": PortLease("a")})
    assert read(idl, ["a", "b"]) == PortsRead({}, frozenset({"a", "b"}))
