"""OvnWorker and its sibling controllers: what runs when, and what a pass does.

`ovn_worker.OvnWorker` owns the accepted desired state, the allocations
(`allocator`) and one `lb_task.LbTask` per load balancer; `plan` turns a load
balancer into a host spec, NAT rules and haproxy members. One work queue
(`queue`, `dispatch`, `controllers`) carries the keys of OvnWorker and of
the sibling controllers: `subnets`, `pods`, `provider_networks`. `gc` sweeps
marked orphans; `udp_health` probes UDP listeners' members; `connlog` writes
udp and tcp listeners' connection lines from conntrack events.
"""
