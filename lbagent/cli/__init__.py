"""The `lbagent` command operators use.

`main` parses the command line, `client` talks to the running agent's API,
`statusview` renders the status document (or rebuilds it from the state
directory when the agent is down), `natcounters` reads a load balancer's NAT
counters from its namespace, `cleanup` removes everything the agent made.
"""
