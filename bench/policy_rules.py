"""What per-load-balancer policy rules cost the host: route lookups with 0..N rules.

Runs in a scratch network namespace of its own (nothing on the host is
touched): adds N rules `from 169.254.x.y lookup T` like the agent's, then
times datagrams sent on an unconnected socket (one route lookup each) to an
ordinary destination, which must walk past all of them. Prints one line per N.

    .venv/bin/python bench/policy_rules.py [N ...]
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import threading
import time

from pyroute2 import IPRoute

CLONE_NEWNET = 0x40000000
PACKETS = 200000


def measure(counts: list[int], skip_block: bool) -> list[tuple[int, float]]:
    libc = ctypes.CDLL(None, use_errno=True)
    results: list[tuple[int, float]] = []

    def work() -> None:
        if libc.unshare(CLONE_NEWNET) != 0:  # this thread only; the namespace dies with it
            raise OSError(ctypes.get_errno(), "unshare")
        with IPRoute() as ipr:
            ipr.link("add", ifname="bench0", kind="veth", peer="bench1")
            index = ipr.link_lookup(ifname="bench0")[0]
            ipr.link("set", index=index, state="up")
            ipr.link("set", index=ipr.link_lookup(ifname="bench1")[0], state="up")
            ipr.addr("add", index=index, address="198.18.0.1", prefixlen=24)
            ipr.neigh("add", dst="198.18.0.77", lladdr="02:00:00:00:00:77", ifindex=index, state=0x80)
            if skip_block:
                # What the agent installs: non-169.254 sources jump past the block.
                ipr.rule("add", priority=31999, action="FR_ACT_NOP")
                ipr.rule(
                    "add",
                    priority=30999,
                    src="169.254.0.0",
                    src_len=16,
                    flags=0x2,  # FIB_RULE_INVERT
                    action="FR_ACT_GOTO",
                    goto=31999,
                )
            added = 0
            for count in counts:
                while added < count:
                    ipr.rule(
                        "add",
                        src=f"169.254.{added // 250}.{added % 250 + 1}",
                        src_len=32,
                        table=0x4C420000 + added,
                        priority=31000,
                    )
                    added += 1
                results.append((count, _send_cost()))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return results


def _send_cost() -> float:
    """Microseconds per datagram sent on an unconnected socket: one route
    lookup, through the rules, per packet."""
    payload = b"x"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        start = time.perf_counter()
        for _ in range(PACKETS):
            sock.sendto(payload, ("198.18.0.77", 9))
        return (time.perf_counter() - start) / PACKETS * 1e6


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("needs root (a scratch network namespace)")
    counts = [int(a) for a in sys.argv[1:]] or [0, 100, 1000, 4000]
    for skip_block in (False, True):
        base = None
        label = "with the skip rule" if skip_block else "rules alone      "
        for count, micros in measure(counts, skip_block):
            base = base if base is not None else micros
            print(f"{label} rules={count:5d}  send {micros:6.2f} us  (+{micros - base:6.2f} us vs 0 rules)")


if __name__ == "__main__":
    main()
