"""The packet counters of one load balancer's NAT rules, read from its namespace (for `lbagent status ID`).

The agent's rules live in the chains LBAGENT-PRE/LBAGENT-POST of the legacy
nat table in netns `lb-<id>` (and, for a dual-stack load balancer, of the
legacy ip6tables nat table), each with a comment `<hash>:<tag>`. The CLI
reads them with `iptables-legacy-save -c` and `ip6tables-legacy-save -c`
(their `[packets:bytes]` prefix is stable to parse); the agent itself never
forks for this.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import asdict, dataclass

from lbagent.ovnhost.nat import CHAIN_HOOKS, comment_hash

OUR_CHAINS = (*CHAIN_HOOKS, *CHAIN_HOOKS.values())  # our chains and the jumps into them
_RULE = re.compile(r"^\[(\d+):(\d+)\] -A (\S+) (.*)$")
TIMEOUT = 10.0


@dataclass(frozen=True)
class CountedRule:
    chain: str
    tag: str
    hash: str | None
    target: str
    to: str
    packets: int
    bytes: int

    def to_json(self) -> dict:
        return asdict(self)


def parse_save(text: str) -> list[CountedRule]:
    """The commented rules of our chains in `iptables-save -c -t nat` output; others are skipped."""
    rules = []
    for line in text.splitlines():
        match = _RULE.match(line.strip())
        if not match or match.group(3) not in OUR_CHAINS:
            continue
        args = _option_values(shlex.split(match.group(4)))
        comment = args.get("--comment", "")
        if comment_hash(comment) is None:
            continue  # not one of ours (a jump someone else added to PREROUTING, say)
        rules.append(
            CountedRule(
                chain=match.group(3),
                tag=comment.partition(":")[2],
                hash=comment_hash(comment),
                target=args.get("-j", ""),
                to=args.get("--to-destination") or args.get("--to-source", ""),
                packets=int(match.group(1)),
                bytes=int(match.group(2)),
            )
        )
    return rules


def _option_values(words: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for option, value in zip(words, words[1:]):
        if option.startswith("-") and not value.startswith("-"):
            values.setdefault(option, value)
    return values


def read_counters(netns: str) -> list[CountedRule]:
    """Counted rules in `netns`, IPv4 then IPv6; RuntimeError saying why when they cannot be read.

    The IPv6 nat table is read only when it exists: asking for it would make
    it, in a namespace the agent keeps without one."""
    rules = parse_save(_run(netns, "iptables-legacy-save", "-c", "-t", "nat"))
    if "nat" in _run(netns, "cat", "/proc/net/ip6_tables_names").split():
        rules += parse_save(_run(netns, "ip6tables-legacy-save", "-c", "-t", "nat"))
    return rules


def _run(netns: str, *argv: str) -> str:
    command = ["ip", "netns", "exec", netns, *argv]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"cannot run {' '.join(command)}: {exc}") from None
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip() or f'exit {result.returncode}'}")
    return result.stdout
