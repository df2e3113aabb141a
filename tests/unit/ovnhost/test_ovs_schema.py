"""What the agent replicates of the Open_vSwitch database: every table, of the tables
with a row per port only the columns it uses, nothing ovs-vswitchd keeps rewriting."""

from pathlib import Path

import pytest
from ovs.db import idl as ovs_idl

from lbagent.ovnhost import ovs

SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")

pytestmark = pytest.mark.skipif(not SCHEMA.exists(), reason="Open vSwitch's schema is not installed")


def _full_schema():
    helper = ovs_idl.SchemaHelper(location=str(SCHEMA))
    helper.register_all()
    return helper.get_idl_schema().tables


@pytest.fixture
def replicated(monkeypatch):
    monkeypatch.setattr(ovs.idlutils, "get_schema_helper", lambda db, name: ovs_idl.SchemaHelper(location=str(SCHEMA)))
    return ovs._replicated_schema("unix:/nowhere").get_idl_schema().tables


def test_port_tables_keep_only_the_columns_used(replicated):
    assert set(replicated["Interface"].columns) == ovs.PORT_COLUMNS["Interface"]
    assert set(replicated["Port"].columns) == ovs.PORT_COLUMNS["Port"]


def test_other_tables_keep_every_column_but_the_churning_ones(replicated):
    full = _full_schema()
    assert set(replicated) == set(full)
    assert set(replicated["Bridge"].columns) == set(full["Bridge"].columns) - {"status"}
    assert {"next_cfg", "cur_cfg", "external_ids"} <= set(replicated["Open_vSwitch"].columns)
    assert "statistics" not in replicated["Open_vSwitch"].columns


def test_every_kept_column_exists_in_the_schema():
    full = _full_schema()
    for table, columns in ovs.PORT_COLUMNS.items():
        assert columns <= set(full[table].columns)
