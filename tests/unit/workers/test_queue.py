"""WorkQueue and TokenBucket: de-duplication, one worker per key, re-add while
handling, backoff growth and reset, the overall rate limit, shutdown, figures
per kind of key; and the Dispatcher that routes a key to its kind's reconcile.

Timings are injected (milliseconds instead of seconds) and every wait is on a
condition with a timeout; time-based assertions are lower bounds, or upper
bounds with a wide margin."""

import asyncio

import pytest
from prometheus_client import REGISTRY

from lbagent.workers.dispatch import Dispatcher, key, kind_of
from lbagent.workers.queue import TokenBucket, WorkQueue
from tests.unit.fakes import drained

WAIT = 5.0  # seconds: generous bound for things that must happen


class Recorder:
    """A handler that records (key, loop time) and lets tests wait for calls."""

    def __init__(self, fail_times: dict | None = None):
        self.calls: list[tuple[str, float]] = []
        self.fail_times = dict(fail_times or {})
        self._cond = asyncio.Condition()

    async def __call__(self, key):
        async with self._cond:
            self.calls.append((key, asyncio.get_running_loop().time()))
            self._cond.notify_all()
        if self.fail_times.get(key, 0) > 0:
            self.fail_times[key] -= 1
            raise RuntimeError(f"{key} failed")

    def keys(self) -> list:
        return [k for k, _ in self.calls]

    async def wait_calls(self, count: int, timeout: float = WAIT) -> None:
        async with self._cond:
            await asyncio.wait_for(self._cond.wait_for(lambda: len(self.calls) >= count), timeout)


@pytest.fixture
async def make_queue():
    queues = []

    def make(**kwargs):
        kwargs.setdefault("backoff_start", 0.01)
        kwargs.setdefault("backoff_max", 0.04)
        queue = WorkQueue("test", **kwargs)
        queues.append(queue)
        return queue

    yield make
    for queue in queues:
        await queue.shutdown(timeout=WAIT)


# --- TokenBucket ------------------------------------------------------------------


def test_token_bucket_burst_then_rate():
    now = [100.0]
    bucket = TokenBucket(rate=10, burst=3, clock=lambda: now[0])
    assert [bucket.reserve() for _ in range(3)] == [0, 0, 0]
    assert bucket.reserve() == pytest.approx(0.1)
    assert bucket.reserve() == pytest.approx(0.2)  # waiters queue up behind each other
    now[0] += 0.2  # both debts paid
    assert bucket.reserve() == pytest.approx(0.1)
    now[0] += 10  # refills only up to the burst
    assert [bucket.reserve() for _ in range(3)] == [0, 0, 0]
    assert bucket.reserve() > 0


def test_token_bucket_rejects_nonsense():
    with pytest.raises(ValueError):
        TokenBucket(rate=0, burst=1)


# --- WorkQueue ----------------------------------------------------------------------


async def test_waiting_keys_are_deduplicated(make_queue):
    queue, handler = make_queue(), Recorder()
    for name in ("a", "b", "a", "a", "b"):
        queue.add(name)
    assert queue.depth == 2
    queue.start(handler, workers=2)
    await handler.wait_calls(2)
    await drained(queue)
    assert sorted(handler.keys()) == ["a", "b"]


async def test_one_key_never_runs_twice_at_once_and_a_readd_runs_again(make_queue):
    queue = make_queue()
    gate, running, seen = asyncio.Event(), {"a": 0}, Recorder()
    overlap = []

    async def handler(key):
        await seen(key)
        if key != "a":
            return
        running["a"] += 1
        overlap.append(running["a"])
        try:
            await gate.wait()
        finally:
            running["a"] -= 1

    queue.add("a")
    queue.start(handler, workers=4)
    await seen.wait_calls(1)
    for _ in range(3):
        queue.add("a")  # while "a" is being handled: one more run afterwards, not three, not now
    queue.add("b")
    await seen.wait_calls(2)  # other keys go ahead on the other workers meanwhile
    assert seen.keys() == ["a", "b"]
    gate.set()
    await seen.wait_calls(3)
    await drained(queue)
    assert seen.keys() == ["a", "b", "a"]
    assert max(overlap) == 1


async def test_a_handler_may_readd_its_own_key(make_queue):
    queue, seen = make_queue(), Recorder()

    async def handler(key):
        await seen(key)
        if len(seen.calls) == 1:
            queue.add(key)

    queue.add("k")
    queue.start(handler)
    await seen.wait_calls(2)
    await drained(queue)
    assert seen.keys() == ["k", "k"]


async def test_failures_back_off_exponentially_up_to_the_cap_and_success_resets(make_queue):
    queue = make_queue(backoff_start=0.01, backoff_max=0.04)
    handler = Recorder(fail_times={"k": 6})
    queue.add("k")
    queue.start(handler)
    await handler.wait_calls(2)
    assert queue.retries("k") >= 1
    assert queue.last_error("k") == "k failed"
    await handler.wait_calls(7)
    await drained(queue)
    assert queue.retries("k") == 0 and queue.last_error("k") is None
    times = [t for _, t in handler.calls]
    gaps = [b - a for a, b in zip(times, times[1:])]
    slack = 0.002  # timers may fire a clock tick early
    for gap, expected in zip(gaps, [0.01, 0.02, 0.04, 0.04, 0.04, 0.04]):
        assert gap >= expected - slack
    assert max(gaps[3:]) < 0.3  # capped: uncapped the last gap would be 0.32 s

    # After the reset the next failure starts again at the bottom of the ladder.
    handler.fail_times["k"] = 1
    queue.add("k")
    await handler.wait_calls(8)
    assert queue.retries("k") == 1
    await handler.wait_calls(9)
    await drained(queue)
    assert queue.retries("k") == 0


async def test_forget_and_delays(make_queue):
    queue = make_queue(backoff_start=10, backoff_max=20)
    queue.add_rate_limited("k")
    queue.add_rate_limited("k")
    assert queue.retries("k") == 2
    assert queue.stats()["delayed"] == 1 and queue.depth == 0
    queue.forget("k")
    assert queue.retries("k") == 0
    queue.add("k")  # running now supersedes the pending retry
    assert queue.stats()["delayed"] == 0 and queue.depth == 1
    queue.add_after("k", 5)  # already waiting: nothing to schedule
    assert queue.stats()["delayed"] == 0
    queue.add_after("j", 5)
    queue.add_after("j", 9)  # a later add never postpones an earlier one
    queue.add_after("j", 0)  # no delay: now
    assert queue.depth == 2 and queue.stats()["delayed"] == 0


async def test_add_after_fires(make_queue):
    queue, handler = make_queue(), Recorder()
    queue.start(handler)
    start = asyncio.get_running_loop().time()
    queue.add_after("later", 0.03)
    queue.add_after("later", 0.02)  # the earlier one wins
    await handler.wait_calls(1)
    assert handler.calls[0][1] - start >= 0.02 - 0.002
    await drained(queue)
    assert handler.keys() == ["later"]


async def test_overall_rate_limit_spaces_handler_starts(make_queue):
    queue, handler = make_queue(rate=100, burst=2), Recorder()
    keys = [f"k{i}" for i in range(12)]
    for name in keys:
        queue.add(name)
    started = asyncio.get_running_loop().time()  # the bucket's clock: time.monotonic
    queue.start(handler, workers=4)
    await handler.wait_calls(len(keys))
    times = sorted(t for _, t in handler.calls)
    # Two starts come from the burst; the other ten wait 10 ms each. Measured
    # from before the start, not from the first handler: a first handler that
    # runs late on a busy machine shortens the span it sees, never the pacing.
    assert times[-1] - started >= (len(keys) - 2) / 100 - 0.001
    assert sorted(handler.keys()) == sorted(keys)


async def test_shutdown_waits_for_running_handlers_and_drops_the_rest(make_queue):
    queue = make_queue()
    gate, seen = asyncio.Event(), Recorder()

    async def handler(key):
        await seen(key)
        if key == "slow":
            await gate.wait()

    queue.add("slow")
    queue.start(handler)
    await seen.wait_calls(1)
    queue.add("waiting")
    queue.add_after("delayed", 0.02)
    stopping = asyncio.create_task(queue.shutdown())
    done, _ = await asyncio.wait({stopping}, timeout=0.1)
    assert not done  # the running handler is not abandoned
    gate.set()
    await asyncio.wait_for(stopping, WAIT)
    queue.add("after")
    queue.add_after("after", 0.01)
    with pytest.raises(asyncio.TimeoutError):
        await seen.wait_calls(2, timeout=0.1)  # the delayed key's time has long passed
    assert seen.keys() == ["slow"]
    assert queue.stats() == {"depth": 0, "delayed": 0, "processing": 0, "retrying": 0}


async def test_shutdown_drops_a_key_waiting_for_a_token_and_cancels_stuck_handlers(make_queue):
    queue = make_queue(rate=0.01, burst=1)  # the second token comes after 100 s
    stuck, seen = asyncio.Event(), Recorder()

    async def handler(key):
        await seen(key)
        await stuck.wait()  # never set

    queue.add("first")
    queue.add("second")
    queue.start(handler, workers=2)
    await seen.wait_calls(1)
    await asyncio.wait_for(queue.shutdown(timeout=0.05), WAIT)
    assert seen.keys() == ["first"]


async def test_start_twice_is_an_error(make_queue):
    queue = make_queue()
    queue.start(Recorder())
    with pytest.raises(RuntimeError):
        queue.start(Recorder())


async def test_stats_by_kind_counts_each_kind_of_key_apart(make_queue):
    queue = make_queue(kind_of=kind_of, backoff_start=10, backoff_max=20)
    gate, seen = asyncio.Event(), Recorder()

    async def handler(key):
        await seen(key)
        await gate.wait()

    queue.add("pod/p1")
    queue.start(handler)
    await seen.wait_calls(1)
    queue.add("subnet/s1")
    queue.add("subnet/s2")
    queue.add_rate_limited("subnet/s3")
    empty = dict.fromkeys(("depth", "delayed", "processing", "retrying"), 0)
    assert queue.stats_by_kind(["pod", "subnet", "loadbalancer"]) == {
        "pod": {**empty, "processing": 1},
        "subnet": {**empty, "depth": 2, "delayed": 1, "retrying": 1},
        "loadbalancer": empty,
    }
    assert queue.depth_of("subnet") == 2 and queue.depth_of("pod") == 0
    # Taken and still being handled counts as unfinished; waiting out a backoff does not.
    assert queue.unfinished_of("pod") == 1 and queue.unfinished_of("subnet") == 2
    assert queue.is_pending("pod/p1") and queue.is_pending("subnet/s3") and not queue.is_pending("pod/p2")
    gate.set()


async def test_a_failure_counts_a_retry_of_its_kind(make_queue):
    queue, handler = make_queue(kind_of=kind_of), Recorder(fail_times={"pod/p": 1})
    before = REGISTRY.get_sample_value("lbagent_queue_retries_total", {"queue": "pod"}) or 0
    queue.add("pod/p")
    queue.start(handler)
    await handler.wait_calls(2)
    await drained(queue)
    assert REGISTRY.get_sample_value("lbagent_queue_retries_total", {"queue": "pod"}) == before + 1


# --- Dispatcher ---------------------------------------------------------------------


async def test_the_dispatcher_hands_the_name_to_its_kinds_reconcile(caplog):
    seen = []

    async def reconcile_pod(name):
        seen.append(("pod", name))

    dispatcher = Dispatcher({"pod": reconcile_pod, "loadbalancer": lambda name: seen.append(("lb", name))})
    assert dispatcher.kinds == ("pod", "loadbalancer")
    await dispatcher(key("pod", "p-1"))
    await dispatcher("loadbalancer/lb-1")  # a plain function (a mere kick) is fine too
    await dispatcher("subnet/s-1")  # nobody handles subnets here: dropped, not retried
    await dispatcher("pod")  # no name
    assert seen == [("pod", "p-1"), ("lb", "lb-1")]
    assert caplog.text.count("no handler for this key") == 2


async def test_a_reconcile_error_reaches_the_queue():
    async def failing(name):
        raise RuntimeError(f"{name} failed")

    with pytest.raises(RuntimeError, match="p failed"):
        await Dispatcher({"pod": failing})("pod/p")


def test_keys_name_their_kind():
    assert key("provider_network", "physnet1") == "provider_network/physnet1"
    assert kind_of("provider_network/physnet1") == "provider_network" and kind_of("odd") == "odd"
