"""python-iptables is imported with distutils hidden, and only for that import."""

import sys
import types

from lbagent.ovnhost import iptc_import


def test_distutils_is_hidden_only_for_the_import(monkeypatch):
    monkeypatch.delitem(sys.modules, "distutils", raising=False)
    assert iptc_import._import_iptc() is iptc_import.iptc
    assert "distutils" not in sys.modules


def test_a_distutils_already_imported_is_left_as_it_is(monkeypatch):
    already = types.ModuleType("distutils")
    monkeypatch.setitem(sys.modules, "distutils", already)
    iptc_import._import_iptc()
    assert sys.modules["distutils"] is already
