"""The API's side of high availability: handover, refusals for this host, metrics."""

from __future__ import annotations

import pytest

from lbagent.api.openapi import document
from tests.unit.samples import AUTH, EXAMPLE


async def test_handover_without_nb_is_a_409(client):
    resp = await client.post("/v1/ha/handover", json={}, headers=AUTH)
    assert resp.status == 409
    assert (await resp.json())["error"] == "ha_not_configured"


async def test_handover_passes_the_ids_and_answers_the_results(client):
    client.agent.handover_results = [{"id": "lb-1", "result": "handed_over", "active_host": "gw-2"}]
    resp = await client.post("/v1/ha/handover", json={"loadbalancers": ["lb-1"]}, headers=AUTH)
    assert resp.status == 200
    assert await resp.json() == {"loadbalancers": client.agent.handover_results}
    assert (await client.post("/v1/ha/handover", headers=AUTH)).status == 200  # no body: all it holds
    assert client.agent.handovers == [["lb-1"], None]


@pytest.mark.parametrize(
    "body", [b"[]", b'{"loadbalancers": "lb-1"}', b'{"ids": []}', b'{"loadbalancers": [""]}', b"{"]
)
async def test_a_bad_handover_body_is_a_400(client, body):
    resp = await client.post("/v1/ha/handover", data=body, headers={**AUTH, "Content-Type": "application/json"})
    assert resp.status == 400
    assert client.agent.handovers == []


async def test_a_state_this_host_cannot_serve_is_a_400_naming_the_field(client):
    client.agent.host_problems = [{"path": "/loadbalancers/0/ha/hosts", "message": "does not name this host"}]
    resp = await client.post("/v1/refresh", json=EXAMPLE, headers=AUTH)
    assert resp.status == 400
    answer = await resp.json()
    assert (answer["error"], answer["details"]) == ("invalid_body", client.agent.host_problems)


async def test_metrics_count_the_roles(client):
    client.agent.handover_results = []
    text = await (await client.get("/metrics", headers=AUTH)).text()
    assert 'lbagent_ha_roles{role="standby"} 2.0' in text
    assert "lbagent_ha_failovers_total" in text and "lbagent_ha_lease_renew_seconds_bucket" in text


def test_the_document_lists_the_handover_and_the_ha_status():
    doc = document()
    assert "/v1/ha/handover" in doc["paths"]
    assert "ha" in doc["components"]["schemas"]["LoadBalancerStatus"]["properties"]
    assert "ha" in doc["components"]["schemas"]["LoadBalancer"]["properties"]
