"""What a schemathesis run may see from the agent and still call the document exact.

Shared by the fuzzing of the app (tests/unit/api/test_schemathesis.py) and of a
running agent (tests/functional/test_schemathesis_agent.py).
"""

import re

from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = 100
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # no example database left in the work tree
    suppress_health_check=list(HealthCheck),
)

# The messages of the cross-field rules (lbagent.desired.crosschecks), which
# the document describes but JSON Schema cannot express.
CROSS_FIELD = re.compile(
    r"(names no (subnet|backend group) of this (request|load balancer)"
    r"|.* is already used at /"
    r"|must lie inside the subnet "
    r"|must not be the network or broadcast address of "
    r"|must not be the subnet's gateway"
    # the IPv6 twins
    r"|must not be the subnet-router anycast address of "
    r"|needs a subnet with cidr6, "
    # dependentRequired in the document counts a null cidr6 or gateway6 as
    # given; the agent counts it as absent, as for every optional field
    r"|required with (cidr6|gateway6): a subnet has both cidr6 and gateway6 or neither$"
    r"|an IPv6 route needs the subnet's cidr6"
    r"|must be an IPv[46] address, like the route's cidr"
    r"|is IPv6, and the load balancer has no network\.ip6"
    r"|has host bits set; the prefix is [0-9a-f:]+/"  # an IPv6 prefix (an IPv4 one: its pattern says it)
    r"|[0-9]+ more problems are not listed"  # past the first 100, all of them tolerated
    r"|must not lie in .*, the agent's own prefix for its IPv6 pairs"
    r"|(the load balancers )?needs? [0-9]+ haproxy servers, more than the "  # the server budget
    r"|must not lie inside the subnet's own prefix "
    r"|redirects to the very request it answers "
    r"|a load balancer has at most [0-9]+ backends "
    # what depends on the agent, not the body (lbagent.desired.ha.host_problems)
    r"|high availability needs the OVN Northbound database"
    r"|does not name this host "
    # what only decoding a certificate or key can tell (lbagent.desired.pem)
    r"|must hold X\.509 certificates: "
    r"|must be an unencrypted private key that decodes"
    r"|must hold exactly one private key block"
    r"|must be an (RSA|EC) key "
    r"|does not belong to the first certificate"
    r"|has an X509 CRL block that does not decode)"
)
# JSON Schema counts 1.0 as an integer; the agent wants integers written as such.
INTEGER_WITH_FRACTION = re.compile(r"must be (a JSON integer|a port number .*) \(got -?[0-9]+\.0\)$")


CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]


def not_cross_field(answer) -> list[dict]:
    return [
        d
        for d in answer.get("details", [])
        if not (CROSS_FIELD.match(d["message"]) or INTEGER_WITH_FRACTION.match(d["message"]))
    ]
