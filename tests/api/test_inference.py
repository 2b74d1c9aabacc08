"""InferencePool: admission by queue size, FIFO order, cancellation, estimate, shutdown."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from heedrank.api.inference import InferencePool
from heedrank.errors import OverloadedError, UnhealthyError


def _run(coro):
    return asyncio.run(coro)


def test_runs_off_the_loop_and_returns_results_and_errors():
    async def main():
        pool = InferencePool("t", workers=2, queue_size=4).start()
        try:
            loop_thread = threading.get_ident()
            assert await pool.run(lambda: threading.get_ident() != loop_thread)
            with pytest.raises(ZeroDivisionError):
                await pool.run(lambda: 1 / 0)
        finally:
            pool.close()

    _run(main())


def test_admits_workers_plus_queue_then_refuses_and_keeps_fifo_order():
    gate = threading.Event()
    order: list[int] = []

    def job(i):
        gate.wait(10)
        order.append(i)
        return i

    async def main():
        pool = InferencePool("t", workers=1, queue_size=2).start()
        try:
            futures = [pool.submit(job, i) for i in range(3)]  # 1 running + 2 waiting
            with pytest.raises(OverloadedError) as err:
                pool.submit(job, 99)
            assert err.value.status_code == 429 and err.value.error_type == "overloaded"
            assert pool.rejected == 1
            gate.set()
            assert await asyncio.gather(*futures) == [0, 1, 2]
            assert order == [0, 1, 2]
        finally:
            pool.close()

    _run(main())


def test_queue_size_zero_admits_only_idle_workers():
    gate = threading.Event()

    async def main():
        pool = InferencePool("t", workers=2, queue_size=0).start()
        try:
            await asyncio.sleep(0.05)  # workers idle
            a, b = pool.submit(gate.wait, 10), pool.submit(gate.wait, 10)
            with pytest.raises(OverloadedError):
                pool.submit(gate.wait, 10)
            gate.set()
            await asyncio.gather(a, b)
        finally:
            pool.close()

    _run(main())


def test_timeout_drops_a_job_that_has_not_started():
    gate = threading.Event()
    ran: list[str] = []

    async def main():
        pool = InferencePool("t", workers=1, queue_size=4).start()
        try:
            blocker = pool.submit(gate.wait, 10)
            with pytest.raises((TimeoutError, asyncio.TimeoutError)):
                await pool.run(ran.append, "late", timeout=0.05)
            assert pool.depth == 1  # still queued, cancelled
            gate.set()
            await blocker
            await pool.run(ran.append, "next")
            assert ran == ["next"]  # the cancelled job never ran
        finally:
            pool.close()

    _run(main())


def test_estimate_learns_seconds_per_unit():
    async def main():
        pool = InferencePool("t", workers=1, queue_size=4).start()
        try:
            assert pool.estimate_seconds(10) is None
            await pool.run(time.sleep, 0.05, units=5)
            spu = pool.seconds_per_unit
            assert 0.005 <= spu <= 0.1
            assert pool.estimate_seconds(10) == pytest.approx(10 * spu)
        finally:
            pool.close()

    _run(main())


def test_close_fails_waiting_jobs_and_refuses_new_ones():
    gate = threading.Event()

    async def main():
        pool = InferencePool("t", workers=1, queue_size=2).start()
        running = pool.submit(gate.wait, 10)
        waiting = pool.submit(lambda: "never")
        await asyncio.sleep(0.05)
        closer = threading.Thread(target=pool.close)
        closer.start()
        with pytest.raises(UnhealthyError):
            await waiting
        gate.set()
        await running
        closer.join(5)
        with pytest.raises(UnhealthyError):
            pool.submit(lambda: 1)

    _run(main())


def test_bad_sizes():
    with pytest.raises(ValueError):
        InferencePool("t", workers=0, queue_size=1)
    with pytest.raises(ValueError):
        InferencePool("t", workers=1, queue_size=-1)


def test_max_wait_refuses_when_the_estimated_wait_is_too_long():
    async def main():
        pool = InferencePool("t", workers=1, queue_size=10, max_wait=0.15).start()
        try:
            await pool.run(time.sleep, 0.1, units=1)  # 0.1 s per unit
            gate = threading.Event()
            running = pool.submit(gate.wait, 10, units=1)  # 0.1 s of work ahead
            queued = pool.submit(time.sleep, 0, units=1)  # 0.2 s ahead of the next one
            with pytest.raises(OverloadedError, match="estimated wait"):
                pool.submit(time.sleep, 0, units=1)
            gate.set()
            await asyncio.gather(running, queued)
            await pool.run(time.sleep, 0, units=1)  # idle again: admitted
        finally:
            pool.close()

    _run(main())


def _stepping_job(steps: list[int], n: int = 100, seconds: float = 0.02):
    """A job of ``n`` steps that checks its cancellation token before each (heedrank.cancel)."""
    from heedrank.cancel import check

    def job():
        for i in range(n):
            check()
            time.sleep(seconds)
            steps.append(i)
        return "done"

    return job


def test_a_started_job_stops_at_its_next_step_when_the_deadline_passes():
    steps: list[int] = []

    async def main():
        pool = InferencePool("t", workers=1, queue_size=4).start()
        try:
            with pytest.raises((TimeoutError, asyncio.TimeoutError)):
                await pool.run(_stepping_job(steps), timeout=0.1)
            t0 = time.perf_counter()
            assert await pool.run(lambda: "next") == "next"  # the worker is free within a step
            assert time.perf_counter() - t0 < 0.5
            assert 1 <= len(steps) < 20  # stopped long before its 100 steps
        finally:
            pool.close()

    _run(main())


def test_a_started_job_of_a_client_that_went_away_stops_and_says_why():
    from heedrank.api.inference import ClientGoneError

    steps: list[int] = []

    async def main():
        pool = InferencePool("t", workers=1, queue_size=4).start()
        pool.disconnect_poll = 0.05
        try:
            async def gone():
                return len(steps) >= 3

            with pytest.raises(ClientGoneError, match="closed the connection"):
                await pool.run(_stepping_job(steps), is_disconnected=gone)
            await pool.run(lambda: None)
            assert 3 <= len(steps) < 20
        finally:
            pool.close()

    _run(main())


def test_a_pool_for_durable_writes_lets_started_jobs_finish():
    steps: list[int] = []

    async def main():
        pool = InferencePool("t", workers=1, queue_size=4, stop_abandoned=False).start()
        try:
            with pytest.raises((TimeoutError, asyncio.TimeoutError)):
                await pool.run(_stepping_job(steps, n=10), timeout=0.05)
            await pool.run(lambda: None)  # waits for the write to end
            assert steps == list(range(10))
        finally:
            pool.close()

    _run(main())
