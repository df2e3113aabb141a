"""Fixtures of the unit tests.

An API client over a fake agent, a fake renderer, and a real haproxy manager in a temporary run_dir.
"""

import asyncio
import os
import signal
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from lbagent.api.app import create_app
from lbagent.haproxy.manager import HaproxyManager
from lbagent.haproxy.render import HaproxyConfig
from lbagent.workers import ovn_worker as worker_mod
from tests.unit.fakes import FakeAgent
from tests.unit.samples import HAPROXY, TOKEN, haproxy_pids_for


@pytest.fixture
async def client():
    agent = FakeAgent()
    client = TestClient(TestServer(create_app(agent, TOKEN, max_body_bytes=64 * 1024, reporter=agent)))
    await client.start_server()
    client.agent = agent
    yield client
    await client.close()


@pytest.fixture
def fake_render(monkeypatch):
    monkeypatch.setattr(
        worker_mod,
        "render_config",
        lambda lb, outer, members, inner: HaproxyConfig(f"{lb.id} {outer} {inner} {members}"),
    )


@pytest.fixture
async def run_dir(tmp_path):
    if not Path(HAPROXY).exists():
        if os.geteuid() == 0:  # as root `make deps` has run: a missing haproxy is a broken set-up
            pytest.fail(f"haproxy is not installed at {HAPROXY} (make deps installs it)")
        pytest.skip("haproxy is not installed (make deps installs it)")
    path = tmp_path / "run"
    yield path
    # Whatever a test left running on its run_dir goes, by pid.
    for pid in haproxy_pids_for(path):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
async def manager(run_dir):
    mgr = HaproxyManager(HAPROXY, run_dir)
    await mgr.start()
    yield mgr
    await mgr.stop()


@pytest.fixture
async def echo_port():
    async def echo(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
