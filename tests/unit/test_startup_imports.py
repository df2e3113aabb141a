"""What the agent's own modules load at start: not setuptools (through python-iptables'
distutils import), not cryptography (only https listeners need it)."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

HEAVY = ("setuptools", "pkg_resources", "distutils", "cryptography")
AGENT = "import lbagent.agent, lbagent.api.server, lbagent.cli.main"
BAD_CERTIFICATE = "-----BEGIN CERTIFICATE-----\\nAAAA\\n-----END CERTIFICATE-----"


def _loaded_after(script: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "SETUPTOOLS_USE_DISTUTILS"}
    code = textwrap.dedent(script) + f"\nimport sys; print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return [m for m in done.stdout.strip().split(",") if m]


def test_the_agent_starts_without_setuptools_or_cryptography():
    assert _loaded_after(AGENT) == []


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="no setuptools, no shim to avoid")
def test_python_iptables_alone_would_load_setuptools():
    # Why the first test can fail: the plain import does load it here.
    assert "setuptools" in _loaded_after("import iptc")


def test_checking_a_certificate_loads_cryptography():
    loaded = _loaded_after(
        f"""
        {AGENT}
        from lbagent.desired import pem
        try:
            pem.certificate_chain("{BAD_CERTIFICATE}")
        except ValueError as exc:
            assert "does not decode" in str(exc), exc
        """
    )
    assert loaded == ["cryptography"]
