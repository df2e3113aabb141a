"""IPv6 values inside the agent's own prefix for its pairs are refused at their paths; the rest of
the unique local block, and IPv4, are not its business."""

from lbagent.desired.model import parse_desired_state
from lbagent.desired.own_prefix import own_prefix_problems

PREFIX = "fd4c:4241::/48"


def state(cidr6: str, backend: str, pod_ip: str, route: str) -> dict:
    gateway6 = cidr6.split("/")[0] + "1"
    return {
        "generation": 1,
        "subnets": [
            {
                "id": "net-1",
                "cidr": "198.18.0.0/24",
                "gateway": "198.18.0.1",
                "cidr6": cidr6,
                "gateway6": gateway6,
                "routes": [{"cidr": route, "nexthop": cidr6.split("/")[0] + "fe"}],
            }
        ],
        "pods": [{"id": "p1", "namespace": "shop", "ip": pod_ip}],
        "loadbalancers": [
            {
                "id": "lb-1",
                "network": {
                    "subnet_id": "net-1",
                    "ip": "198.18.0.12",
                    "ip6": cidr6.split("/")[0] + "12",
                    "mac": "00:22:0a:00:00:12",
                },
                "backend_groups": [{"id": "bg-1", "backends": [{"id": "be-1", "address": backend, "port": 80}]}],
            }
        ],
    }


def test_values_in_the_agents_prefix_are_refused_at_their_paths():
    desired = parse_desired_state(state("fd4c:4241:0:9::/64", "fd4c:4241::7", "fd4c:4241:0:1::5", "fd4c:4241:0:2::/64"))
    problems = own_prefix_problems(desired, PREFIX)
    assert [p["path"] for p in problems] == [
        "/subnets/0/cidr6",
        "/subnets/0/routes/0/cidr",
        "/pods/0/ip",
        "/loadbalancers/0/backend_groups/0/backends/0/address",
    ]
    assert "fd4c:4241::/48" in problems[0]["message"] and "inner_prefix6" in problems[0]["message"]


def test_the_rest_of_the_unique_local_block_is_fine():
    desired = parse_desired_state(state("fd00:1::/64", "fd00:1::21", "2001:db8::5", "fd00:2::/64"))
    assert own_prefix_problems(desired, PREFIX) == []
    assert own_prefix_problems(desired, "fd00:1::/48") != []
