from lbagent.desired.model import Pod, PodSelector
from lbagent.workers.plan import Target, selected_pods


def pod(pod_id, ip, ready=True, namespace="shop", labels=None, ports=None):
    return Pod(
        id=pod_id,
        namespace=namespace,
        ip=ip,
        ready=ready,
        labels=labels or {"app": "web"},
        ports=ports if ports is not None else [{"name": "http", "port": 8080, "protocol": "tcp"}],
    )


def test_selects_ready_pods_in_the_namespace_with_all_labels():
    pods = [
        pod("p1", "198.18.0.21"),
        pod("p2", "198.18.0.22", ready=False),
        pod("p3", "198.18.0.23", namespace="other"),
        pod("p4", "198.18.0.24", labels={"app": "db"}),
        pod("p5", "198.18.0.25", labels={"app": "web", "tier": "front"}),
    ]
    selector = PodSelector(namespace="shop", labels={"app": "web"}, port=9000, weight=3)
    assert selected_pods(selector, pods) == [Target("p1", "198.18.0.21", 9000, 3), Target("p5", "198.18.0.25", 9000, 3)]


def test_named_port_is_looked_up_per_pod_and_pods_without_it_are_skipped():
    pods = [
        pod("p1", "198.18.0.21"),
        pod("p2", "198.18.0.22", ports=[{"name": "http", "port": 8081, "protocol": "tcp"}]),
        pod("p3", "198.18.0.23", ports=[{"name": "metrics", "port": 9100, "protocol": "tcp"}]),
    ]
    selector = PodSelector(namespace="shop", labels={"app": "web"}, port="http")
    assert [(t.key, t.port) for t in selected_pods(selector, pods)] == [("p1", 8080), ("p2", 8081)]


def test_members_come_in_pod_id_order_whatever_the_list_order():
    pods = [pod("p3", "198.18.0.23"), pod("p1", "198.18.0.21"), pod("p2", "198.18.0.22")]
    selector = PodSelector(namespace="shop", labels={"app": "web"}, port="http")
    assert [t.key for t in selected_pods(selector, pods)] == ["p1", "p2", "p3"]
    assert selected_pods(selector, pods) == selected_pods(selector, list(reversed(pods)))
