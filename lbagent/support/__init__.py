"""asyncio plumbing with no knowledge of load balancers.

Named thread pools for blocking work (`blocking`), batching of calls that
arrive while one runs (`coalesce`), cancellation-safe timed waits (`waits`)
and the interpreter's garbage-collector pacing (`heap`).
"""
