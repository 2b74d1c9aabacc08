"""InferencePool: admission by queue size, FIFO order, cancellation, estimate, deadlines, shutdown."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from heedrank.api.inference import DeadlineExceeded, InferencePool
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


# -------------------------------------------------------------------- deadline (absolute, wait included)
def test_a_deadline_counts_the_wait_for_a_worker():
    gate = threading.Event()
    ran: list[str] = []

    async def main():
        pool = InferencePool("t", workers=1, queue_size=4).start()
        try:
            blocker = pool.submit(gate.wait, 10)
            t0 = time.perf_counter()
            with pytest.raises(DeadlineExceeded) as caught:
                await pool.run(ran.append, "late", deadline=t0 + 0.3)
            assert 0.25 < time.perf_counter() - t0 < 1.5  # at the deadline, not after a run
            assert caught.value.reason == "timeout" and caught.value.ran == 0.0  # it never started
            gate.set()
            await blocker
            await pool.run(ran.append, "next")
            assert ran == ["next"]  # the dropped job never ran
        finally:
            gate.set()
            pool.close()

    _run(main())


def test_a_job_estimated_to_end_past_its_deadline_is_answered_at_once_unqueued():
    ran: list[str] = []

    async def main():
        pool = InferencePool("t", workers=1, queue_size=4).start()
        try:
            pool.seed(0.5)  # 0.5 s per unit: 10 units take 5 s
            t0 = time.perf_counter()
            with pytest.raises(DeadlineExceeded) as caught:
                await pool.run(ran.append, "late", units=10, deadline=t0 + 2.0)
            assert time.perf_counter() - t0 < 0.5 and caught.value.reason == "estimate"
            assert pool.depth == 0 and pool.rejected == 0  # not queued, and no 429 counted
            assert await pool.run(ran.append, "fits", units=1, deadline=time.perf_counter() + 2.0) is None
            assert ran == ["fits"]
        finally:
            pool.close()

    _run(main())


def test_a_queued_job_whose_worker_frees_too_late_is_answered_then_unstarted():
    gate = threading.Event()
    ran: list[str] = []

    async def main():
        pool = InferencePool("t", workers=1, queue_size=4).start()
        try:
            pool.seed(0.2)  # 10 units: an estimated run of 2 s
            blocker = pool.submit(gate.wait, 10, units=0)  # no units: the estimate at submission is the job's own
            t0 = time.perf_counter()
            late = asyncio.ensure_future(pool.run(ran.append, "late", units=10, deadline=t0 + 3.0))
            await asyncio.sleep(1.5)  # admitted (2 s < 3 s), then the worker frees with about 1.5 s left
            assert not late.done() and pool.depth == 1
            gate.set()
            with pytest.raises(DeadlineExceeded) as caught:
                await late
            assert caught.value.reason == "estimate" and time.perf_counter() - t0 < 2.8  # before its deadline
            await blocker
            assert ran == []
        finally:
            gate.set()
            pool.close()

    _run(main())


def test_a_running_job_is_stopped_at_its_deadline_and_says_how_long_it_ran():
    steps: list[int] = []

    async def main():
        pool = InferencePool("t", workers=1, queue_size=4).start()
        try:
            t0 = time.perf_counter()
            with pytest.raises(DeadlineExceeded) as caught:
                await pool.run(_stepping_job(steps), deadline=t0 + 0.3)
            assert caught.value.reason == "timeout" and 0.1 < caught.value.ran < 1.0
            t1 = time.perf_counter()
            assert await pool.run(lambda: "next") == "next"  # the worker is free within a step
            assert time.perf_counter() - t1 < 0.5
            assert 1 <= len(steps) < 50  # stopped long before its 100 steps
        finally:
            pool.close()

    _run(main())


def test_a_job_error_that_is_a_timeout_is_the_job_s_own():
    async def main():
        pool = InferencePool("t", workers=1, queue_size=4).start()

        def fails():
            raise TimeoutError("the job's own")

        try:
            with pytest.raises(TimeoutError, match="the job's own") as caught:
                await pool.run(fails, deadline=time.perf_counter() + 5.0)
            assert not isinstance(caught.value, DeadlineExceeded)
        finally:
            pool.close()

    _run(main())


def test_idle_for_is_zero_while_a_job_waits_or_runs_and_counts_from_the_last_job_after():
    gate = threading.Event()

    async def main():
        pool = InferencePool("t", workers=1, queue_size=2).start()
        try:
            assert pool.idle_for() > 0.0
            running, waiting = pool.submit(gate.wait, 10), pool.submit(lambda: None)
            assert pool.idle_for() == 0.0  # one running, one waiting for the worker
            gate.set()
            await asyncio.gather(running, waiting)
            for _ in range(200):  # the worker comes back from the job just after its result
                if pool.idle_for() > 0.0:
                    break
                await asyncio.sleep(0.005)
            idle = pool.idle_for()
            assert 0.0 < idle < 5.0
            await asyncio.sleep(0.05)
            assert pool.idle_for() >= idle + 0.04
        finally:
            pool.close()
        assert pool.idle_for() > 0.0  # a closed pool runs nothing

    _run(main())
