"""The agent's face to the region controller and to systemd.

`app` is the aiohttp application (refresh, status, health, readiness,
metrics), `openapi` and `responses` the document it serves and the shapes of
its answers, `status` the status documents, `server` the foreground run with
its listener, `sdnotify` the service notifications.
"""
