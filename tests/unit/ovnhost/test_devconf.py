"""Per-link settings: written only where the link's own lookup shows a difference."""

import pytest

from lbagent.ovnhost import devconf
from lbagent.ovnhost.errors import LinkNotFound
from lbagent.ovnhost.iplib import Link

IPV6_OFF_CONF = tuple(1 if i == devconf.IPV6_CONF_INDEX["disable_ipv6"] else 0 for i in range(60))
IPV6_ON_CONF = tuple(-1 if i == devconf.IPV6_CONF_INDEX["accept_dad"] else 0 for i in range(60))


def link(ipv4_conf=(), ipv6_conf=(), name="lb0") -> Link:
    return Link(3, name, "veth", "00:22:0a:00:00:12", 1442, True, 4, ipv4_conf=ipv4_conf, ipv6_conf=ipv6_conf)


@pytest.fixture
def sysctls(monkeypatch):
    """path -> value of the sysctls written; every file reads as "0" before."""
    written: dict[str, str] = {}

    def write(path: str, value: str, read_first: bool = True) -> bool:
        written[path] = value if read_first else f"{value} unread"
        return value != "0" or not read_first

    monkeypatch.setattr(devconf, "write_sysctl", write)

    def forward_ipv4(links) -> None:  # over netlink, link by link: noted as "forward <name>"
        written.update({f"forward {each.name}": "" for each in links})

    monkeypatch.setattr(devconf, "forward_ipv4", forward_ipv4)
    return written


def test_a_setting_the_lookup_shows_in_place_is_not_touched(sysctls):
    devconf.set_ipv6("lb0", False, link(ipv6_conf=IPV6_OFF_CONF))
    forwarding = link(ipv4_conf=(1, 0), ipv6_conf=(1,) + IPV6_OFF_CONF[1:])
    devconf.ensure_forwarding(True, (forwarding, forwarding))
    assert sysctls == {}


def test_a_difference_or_no_lookup_goes_to_proc_sys(sysctls):
    devconf.set_ipv6("lb0", True, link(ipv6_conf=IPV6_ON_CONF))  # accept_dad -1, not 0
    assert sysctls["net/ipv6/conf/lb0/accept_dad"] == "0" and sysctls["net/ipv6/conf/lb0/disable_ipv6"] == "0"
    sysctls.clear()
    devconf.set_ipv6("default", False)
    devconf.ensure_forwarding(True, (link(ipv4_conf=(0,), ipv6_conf=()),))  # too short to tell: written
    assert sysctls == {
        "net/ipv6/conf/default/disable_ipv6": "1",
        "forward lb0": "",
        "net/ipv6/conf/all/forwarding": "1 unread",  # writing all sets each link's copy, even at 1
    }


def test_what_the_pass_has_just_made_is_written_unread(sysctls):
    devconf.set_ipv6("default", False, fresh=True)
    devconf.set_ipv6("h1234abcd1", True, fresh=True)
    assert sysctls == {
        "net/ipv6/conf/default/disable_ipv6": "1 unread",
        **{f"net/ipv6/conf/h1234abcd1/{key}": f"{value} unread" for key, value in devconf.IPV6_ON},
    }


@pytest.mark.parametrize("off", [0, 1])
def test_only_the_end_that_does_not_forward_is_set_and_ip_forward_is_left_alone(sysctls, off):
    ends = [link(ipv4_conf=(1,), ipv6_conf=(1,), name=name) for name in ("o0", "h0")]
    ends[off] = link(ipv4_conf=(0,), ipv6_conf=(0,), name=ends[off].name)
    devconf.ensure_forwarding(True, ends)
    assert sysctls == {f"forward {ends[off].name}": "", "net/ipv6/conf/all/forwarding": "1 unread"}
    sysctls.clear()
    devconf.ensure_forwarding(False, ends)  # IPv4 only: IPv6's copies are not looked at
    assert sysctls == {f"forward {ends[off].name}": ""}


def test_without_ipv6_in_the_kernel_off_is_nothing_to_do_and_on_is_an_error(monkeypatch):
    def missing(path, value, read_first=True):
        raise FileNotFoundError(path)

    monkeypatch.setattr(devconf, "write_sysctl", missing)
    devconf.set_ipv6("lb0", False)
    with pytest.raises(LinkNotFound):
        devconf.set_ipv6("lb0", True)
