"""haproxy: one master process serving every load balancer of the host.

`render` (with `templating`, `templates/`, `views`, `routing`, `tls`) turns a
load balancer into its configuration text and files; `manager.HaproxyManager`
is the face OvnWorker uses, over `changes` (prepare, check, queue or
drop a change), `handoff` (a pass's change checked while its host part runs),
`reloads` and `batching` (coalesced, paced reloads), `liveapply` and `live`
(server changes through the runtime API, no reload), `lifecycle` and
`process` (start, adopt, supervise the master), `files` and `candidate` (the
run directory, staged candidates), `sockets` (the stats and master sockets).
"""
