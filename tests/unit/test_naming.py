from lbagent.naming import INTERFACE_RE, iface_id, interface_names, lb_id_from_netns, names_from_interface, netns_name


def test_names_fit_and_are_marked():
    names = interface_names("3f2a9c1e-5d7b-4e0a-9c3f-2a9c1e5d7b4e")
    for name in (names.ovn_ns, names.ovn_host, names.haproxy_ns, names.haproxy_host):
        assert len(name) <= 15
        assert INTERFACE_RE.match(name)
    assert names.ovn_ns[:-1] == names.ovn_host[:-1]


def test_ids_sharing_a_prefix_get_distinct_names():
    a = interface_names("aaaaaaaaaaaaaaaaaaaa-one")
    b = interface_names("aaaaaaaaaaaaaaaaaaaa-two")
    assert a.tag != b.tag


def test_salt_changes_the_name_and_is_deterministic():
    assert interface_names("x", 1) == interface_names("x", 1)
    assert interface_names("x", 1).tag != interface_names("x").tag


def test_netns_and_iface_id():
    assert netns_name("web") == "lb-web"
    assert lb_id_from_netns("lb-web") == "web"
    assert lb_id_from_netns("other") is None
    assert iface_id("web") == "iface/lb/web"


def test_names_from_any_interface_of_the_set():
    names = interface_names("web")
    for name in (names.ovn_ns, names.ovn_host, names.haproxy_ns, names.haproxy_host):
        assert names_from_interface(name) == names
    assert names_from_interface("eth0") is None
