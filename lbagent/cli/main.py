"""The `lbagent` command: run the agent, show status, clean up the host."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import click

from lbagent.config import DEFAULT_CONFIG_PATH, load_config
from lbagent.errors import ConfigError

CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    default=None,
    help=f"configuration file (default {DEFAULT_CONFIG_PATH} if it exists)",
)


def _load(config_path: Path | None):
    if config_path is None and DEFAULT_CONFIG_PATH.exists():
        config_path = DEFAULT_CONFIG_PATH
    try:
        return load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
@click.version_option(package_name="lbagent")
def main() -> None:
    """Host agent for VPC load balancers on OVN gateway hosts."""


@main.command()
@CONFIG_OPTION
def run(config_path: Path | None) -> None:
    """Run the agent in the foreground (what the systemd unit starts)."""
    from lbagent.api.server import serve
    from lbagent.logs import setup_logging
    from lbagent.support.heap import limit_malloc_arenas

    limit_malloc_arenas()  # before any thread, the log writer's included
    config = _load(config_path)
    # The token is redacted from every log line, whichever module writes it.
    with setup_logging(config.agent.log_level, config.agent.log_format, secrets=[config.read_token()]):
        try:
            asyncio.run(serve(config))
        except ConfigError as exc:  # found at start (a socket already in use, say)
            raise click.ClickException(str(exc)) from None


@main.command()
@CONFIG_OPTION
@click.option("--json", "as_json", is_flag=True, help="print the status document as JSON")
@click.argument("lb_id", required=False)
def status(config_path: Path | None, as_json: bool, lb_id: str | None) -> None:
    """Show the agent's status (from the running agent, or the state directory).

    With ID: that load balancer's listeners, backends (mapped ports, health)
    and the packet counters of its NAT rules, read from its namespace.
    """
    from lbagent.cli.statusview import collect_status, render_status

    config = _load(config_path)
    document, source = collect_status(config, lb_id)
    if as_json:
        click.echo(json.dumps({**document, "source": source}, indent=2))
    else:
        # Colour only for a person at a terminal (and never with NO_COLOR set).
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        click.echo(render_status(document, source, color=color, detail=lb_id is not None), color=color)


@main.command()
@CONFIG_OPTION
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
def cleanup(config_path: Path | None, yes: bool) -> None:
    """Remove everything the agent created on this host (and only that)."""
    from lbagent.cli.cleanup import cleanup_host

    config = _load(config_path)
    if not yes and sys.stdin.isatty():
        click.confirm("Remove every load balancer namespace, link, OVS port and haproxy of lbagent?", abort=True)
    # On a terminal, one line that keeps saying how far it is (3,000 load balancers take a minute).
    shown = sys.stderr.isatty()

    def progress(line: str) -> None:
        if shown:
            click.echo(f"\r\033[K{line}", nl=False, err=True)

    lines = asyncio.run(cleanup_host(config, progress))
    if shown:
        click.echo("\r\033[K", nl=False, err=True)
    for line in lines:
        click.echo(line)


@main.group()
def ha() -> None:
    """High availability: the leases of load balancers with `ha`."""


@ha.command()
@CONFIG_OPTION
@click.argument("lb_ids", nargs=-1)
def handover(config_path: Path | None, lb_ids: tuple[str, ...]) -> None:
    """Hand load balancers this host holds (all of them without ID) to the next
    ready host of their ha.hosts; exits 1 if one of them was not taken."""
    from lbagent.cli.client import AgentUnreachable, request

    config = _load(config_path)
    body = {"loadbalancers": list(lb_ids)} if lb_ids else {}
    try:
        code, answer = request(config, "POST", "/v1/ha/handover", body, timeout=HANDOVER_WAIT)
    except AgentUnreachable as exc:
        raise click.ClickException(str(exc)) from None
    if code != 200 or not isinstance(answer, dict):
        message = answer.get("message") if isinstance(answer, dict) else answer
        raise click.ClickException(f"the agent answered {code}: {message}")
    results = answer.get("loadbalancers", [])
    for result in results:
        where = f" (active: {result['active_host']})" if result.get("active_host") else ""
        click.echo(f"{result['id']}: {result['result']}{where}")
    if not results:
        click.echo("this host holds no load balancer")
    if any(result["result"] == "not_taken" for result in results):
        sys.exit(1)


HANDOVER_WAIT = 45.0  # seconds: the agent answers within 30
