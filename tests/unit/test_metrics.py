"""/metrics: the process metrics plus what is read from the agent at scrape time."""

from prometheus_client.parser import text_string_to_metric_families

from lbagent import metrics
from tests.unit.samples import AUTH


class Task:
    def __init__(self, state, retries=0, last_error=None, attempted=7, deleting=False, passed=None):
        self.state, self.retries, self.last_error = state, retries, last_error
        self.attempted_generation, self.deleting = attempted, deleting
        self.passed = state == "ready" if passed is None else passed


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def scrape(client):
    resp = await client.get("/metrics", headers=AUTH)
    assert resp.status == 200 and resp.content_type == "text/plain"
    return samples(await resp.text())


async def test_agent_figures_are_exported(client):
    agent = client.agent
    agent.worker.generation = 7
    agent.worker.tasks = {
        "a": Task("ready"),
        "b": Task("error", retries=3, last_error="boom"),
        "c": Task("pending", attempted=None),
        "d": Task("deleting", deleting=True),
    }
    agent.haproxy.counts.update(reloads=5, failed_reloads=2, starts=1, running=True)
    agent.ready_reason = None
    found = await scrape(client)
    assert agent.gauges_updated == 1
    assert found[("lbagent_haproxy_reloads_total", ())] == 5
    assert found[("lbagent_haproxy_failed_reloads_total", ())] == 2
    assert found[("lbagent_haproxy_up", ())] == 1
    assert found[("lbagent_reconcile_retries", ())] == 3
    assert found[("lbagent_loadbalancers_in_backoff", ())] == 1
    assert found[("lbagent_generation", ())] == 7
    assert found[("lbagent_ready", ())] == 1
    assert found[("lbagent_queue_depth", (("queue", "loadbalancers"),))] == 2  # pending + deleting
    assert ("lbagent_neighbour_entries_needed", ()) not in found  # nothing accepted yet

    agent.neighbours.update(entries_needed=1_500, limits={"ipv4": {"soft": 1_500, "hard": 3_000}})
    found = await scrape(client)
    assert found[("lbagent_neighbour_entries_needed", ())] == 1_500
    assert found[("lbagent_neighbour_table_limit", (("family", "ipv4"),))] == 3_000

    agent.haproxy.counts.update(reloads=6, running=False)
    agent.worker.tasks = {}
    agent.worker.generation = None
    found = await scrape(client)
    assert found[("lbagent_haproxy_reloads_total", ())] == 6
    assert found[("lbagent_haproxy_up", ())] == 0
    assert found[("lbagent_generation", ())] == -1
    assert found[("lbagent_queue_depth", (("queue", "loadbalancers"),))] == 0


async def test_haproxy_failing_and_load_balancers_waiting_to_serve(client):
    agent = client.agent
    agent.worker.generation = 7
    # Passed, waiting for ovn-installed: not ready, yet nothing left to reconcile.
    agent.worker.tasks = {"a": Task("pending", passed=True)}
    agent.haproxy.counts.update(running=False, last_error="haproxy did not start (exit 1)")
    agent.ready_reason = "haproxy not running: haproxy did not start (exit 1)"
    found = await scrape(client)
    assert found[("lbagent_haproxy_up", ())] == 0
    assert found[("lbagent_haproxy_reload_failing", ())] == 1
    assert found[("lbagent_ready", ())] == 0
    assert found[("lbagent_queue_depth", (("queue", "loadbalancers"),))] == 0
    agent.haproxy.counts.update(running=True, last_error=None)
    found = await scrape(client)
    assert found[("lbagent_haproxy_reload_failing", ())] == 0


async def test_registered_queues_are_read_at_scrape_time(client):
    depth = [4]
    metrics.track_queue("test-queue", lambda: depth[0])
    metrics.track_queue("gone", lambda: 1 // 0)  # a broken depth function costs its own line only
    assert (await scrape(client))[("lbagent_queue_depth", (("queue", "test-queue"),))] == 4
    depth[0] = 0
    found = await scrape(client)
    assert found[("lbagent_queue_depth", (("queue", "test-queue"),))] == 0
    assert ("lbagent_queue_depth", (("queue", "gone"),)) not in found
    metrics.count_queue_retry("test-queue")
    metrics.count_queue_retry("test-queue")
    assert (await scrape(client))[("lbagent_queue_retries_total", (("queue", "test-queue"),))] == 2


async def test_api_requests_are_counted_by_route_template(client):
    key = ("lbagent_api_requests_total", (("code", "404"), ("method", "GET"), ("route", "/v1/loadbalancers/{lb_id}")))
    before = (await scrape(client)).get(key, 0)
    for name in ("x1", "x2"):
        assert (await client.get(f"/v1/loadbalancers/{name}", headers=AUTH)).status == 404
    assert (await client.get("/v1/status")).status == 401
    found = await scrape(client)
    assert found[key] == before + 2
    assert found[("lbagent_api_requests_total", (("code", "401"), ("method", "GET"), ("route", "/v1/status")))] >= 1
    # Raw paths never become label values: a scanner cannot grow the registry.
    await client.get("/no/such/path/123", headers=AUTH)
    assert not any("123" in dict(labels).get("route", "") for _, labels in (await scrape(client)))


def test_ovsdb_sessions_count_reconnects(monkeypatch):
    monkeypatch.setattr(metrics, "_ovsdb_sessions", 0)
    connects = metrics.OVSDB_CONNECTIONS._value.get()
    reconnects = metrics.OVSDB_RECONNECTS._value.get()
    metrics.note_ovsdb_session()
    assert metrics.OVSDB_RECONNECTS._value.get() == reconnects
    metrics.note_ovsdb_session()
    metrics.note_ovsdb_session()
    assert metrics.OVSDB_CONNECTIONS._value.get() == connects + 3
    assert metrics.OVSDB_RECONNECTS._value.get() == reconnects + 2


def test_vips_are_counted_by_family():
    metrics.set_vips([True, False, False])
    assert metrics.VIPS.labels("ipv4")._value.get() == 3
    assert metrics.VIPS.labels("ipv6")._value.get() == 1
    metrics.set_vips([])
    assert metrics.VIPS.labels("ipv6")._value.get() == 0
