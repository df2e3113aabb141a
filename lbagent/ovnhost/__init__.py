"""The host side of the agent: what load balancers and provider networks need in
this gateway host's kernel (namespaces, links, routes, NAT) and in Open vSwitch."""

from lbagent.ovnhost import pyroute2_import

pyroute2_import.register()  # before any module here imports pyroute2
