"""The client of the high-availability benchmark: a new HTTP connection to one address every interval.

    python bench/ha_probe.py ADDRESS PORT [INTERVAL_SECONDS]

Run inside the client's network namespace (bench/ha.py starts it there). Each
attempt prints one line when it ends, `<start> <end> <outcome>`, the times on
the machine's monotonic clock (the same in every network namespace, so they
line up with the benchmark's own `time.monotonic()`), the outcome one of:

- `ok`: an HTTP 200 came back;
- `refused`: the connection was not made within CONNECT_TIMEOUT (refused,
  unreachable or no answer to the SYN nor to its one retransmission, which
  Linux sends after a second: a lost SYN alone is a slow connection, not a
  failed one);
- `broken`: the connection was made but the answer did not come (reset,
  closed early, or nothing within ANSWER_TIMEOUT).

Attempts start on a fixed schedule and run concurrently, so one that waits
for its timeout does not delay the next: the resolution stays the interval.
Runs until it is signalled.
"""

from __future__ import annotations

import asyncio
import sys
import time

CONNECT_TIMEOUT = 3.0
ANSWER_TIMEOUT = 2.0
REQUEST = b"GET / HTTP/1.0\r\nHost: vip\r\n\r\n"


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    writer.write(REQUEST)
    await writer.drain()
    data = await reader.read()  # HTTP/1.0: the server closes after its answer
    status_line = data.split(b"\r\n", 1)[0].split()
    return len(status_line) >= 2 and status_line[1] == b"200"


async def attempt(address: str, port: int) -> str:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(address, port), CONNECT_TIMEOUT)
    except (TimeoutError, OSError):
        return "refused"
    try:
        return "ok" if await asyncio.wait_for(_answer(reader, writer), ANSWER_TIMEOUT) else "broken"
    except (TimeoutError, OSError):
        return "broken"
    finally:
        writer.close()


async def report(address: str, port: int) -> None:
    start = time.monotonic()
    outcome = await attempt(address, port)
    print(f"{start:.4f} {time.monotonic():.4f} {outcome}", flush=True)


async def probe(address: str, port: int, interval: float) -> None:
    running: set[asyncio.Task] = set()
    next_start = time.monotonic()
    while True:
        task = asyncio.create_task(report(address, port))
        running.add(task)
        task.add_done_callback(running.discard)
        next_start += interval
        await asyncio.sleep(max(0.0, next_start - time.monotonic()))


def main(argv: list[str]) -> int:
    address, port = argv[0], int(argv[1])
    interval = float(argv[2]) if len(argv) > 2 else 0.02
    try:
        asyncio.run(probe(address, port, interval))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
