"""lbagent: the host agent that makes VPC load balancers real on OVN gateway hosts."""

__version__ = "0.1.0"
