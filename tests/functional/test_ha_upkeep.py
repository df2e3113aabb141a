"""devtools.ha_upkeep, small: its own Northbound server and two lease keepers (no sandbox lock)."""

from __future__ import annotations

from devtools.ha_upkeep import measure


def test_the_upkeep_measurement_holds_every_lease_with_heartbeats_only():
    result = measure(n=20, window=3.0, lease=1.5, timeout=60)
    assert result["n"] == 20
    # The holder's heartbeat: about three transactions per lease time; the standby writes nothing.
    assert 1.0 <= result["transactions_per_second"]["gw-1"] <= 4.0
    assert result["transactions_per_second"]["gw-2"] == 0
    assert set(result["cpu_percent"]) == {"gw-1", "gw-2", "server"}
