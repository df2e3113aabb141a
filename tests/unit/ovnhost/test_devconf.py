"""Per-link settings: written only where the link's own lookup shows a difference."""

import pytest

from lbagent.ovnhost import devconf
from lbagent.ovnhost.errors import LinkNotFound
from lbagent.ovnhost.iplib import Link

IPV6_OFF_CONF = tuple(1 if i == devconf.IPV6_CONF_INDEX["disable_ipv6"] else 0 for i in range(60))
IPV6_ON_CONF = tuple(-1 if i == devconf.IPV6_CONF_INDEX["accept_dad"] else 0 for i in range(60))


def link(ipv4_conf=(), ipv6_conf=()) -> Link:
    return Link(3, "lb0", "veth", "00:22:0a:00:00:12", 1442, True, 4, ipv4_conf=ipv4_conf, ipv6_conf=ipv6_conf)


@pytest.fixture
def sysctls(monkeypatch):
    """path -> value of the sysctls written; every file reads as "0" before."""
    written: dict[str, str] = {}
    monkeypatch.setattr(devconf, "write_sysctl", lambda path, value: written.update({path: value}) or value != "0")
    return written


def test_a_setting_the_lookup_shows_in_place_is_not_touched(sysctls):
    devconf.set_ipv6("lb0", False, link(ipv6_conf=IPV6_OFF_CONF))
    devconf.ensure_forwarding(True, link(ipv4_conf=(1, 0), ipv6_conf=(1,) + IPV6_OFF_CONF[1:]))
    assert sysctls == {}


def test_a_difference_or_no_lookup_goes_to_proc_sys(sysctls):
    devconf.set_ipv6("lb0", True, link(ipv6_conf=IPV6_ON_CONF))  # accept_dad -1, not 0
    assert sysctls["net/ipv6/conf/lb0/accept_dad"] == "0" and sysctls["net/ipv6/conf/lb0/disable_ipv6"] == "0"
    sysctls.clear()
    devconf.set_ipv6("default", False)
    devconf.ensure_forwarding(True, link(ipv4_conf=(0,), ipv6_conf=()))  # too short to tell: written
    assert sysctls == {
        "net/ipv6/conf/default/disable_ipv6": "1",
        "net/ipv4/ip_forward": "1",
        "net/ipv6/conf/all/forwarding": "1",
    }


def test_without_ipv6_in_the_kernel_off_is_nothing_to_do_and_on_is_an_error(monkeypatch):
    def missing(path, value):
        raise FileNotFoundError(path)

    monkeypatch.setattr(devconf, "write_sysctl", missing)
    devconf.set_ipv6("lb0", False)
    with pytest.raises(LinkNotFound):
        devconf.set_ipv6("lb0", True)
