"""api/thread_pool.py: the pool a server worker's requests run in, on its own.

(tests/api/test_connection_balance.py serves requests through it in a real gunicorn.)"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent import futures

import pytest

from api.thread_pool import LastIdleThreadPool
from tests.api.conftest import ROOT


def _hold_all(pool: LastIdleThreadPool, n: int) -> tuple[threading.Event, list[futures.Future]]:
    """``n`` pieces of work that run at once until the event is set."""
    go, arrived = threading.Event(), threading.Semaphore(0)

    def held() -> int:
        arrived.release()
        go.wait(30)
        return threading.get_ident()

    held_futures = [pool.submit(held) for _ in range(n)]
    for _ in range(n):
        assert arrived.acquire(timeout=30)
    return go, held_futures


def _idle_threads(pool: LastIdleThreadPool, n: int) -> set[int]:
    """``n`` threads started (``n`` pieces of work held at once) and all back idle; their idents."""
    go, held = _hold_all(pool, n)
    go.set()
    ended = {f.result(30) for f in held}
    deadline = time.monotonic() + 30
    while len(pool._idle) < n and time.monotonic() < deadline:  # a thread is idle before its future is done
        time.sleep(0.01)
    assert len(pool._idle) == n
    return ended


def test_work_goes_to_the_thread_that_went_idle_last():
    pool = LastIdleThreadPool(4)
    try:
        assert len(_idle_threads(pool, 4)) == 4
        served = {pool.submit(threading.get_ident).result(30) for _ in range(20)}
        assert len(served) == 1, served  # the stdlib's pool: all 4 in turn
    finally:
        pool.shutdown()


def test_work_handed_out_by_a_done_callback_goes_to_the_thread_that_finished():
    # gunicorn's way: a request's future, once done, hands its connection back to the
    # loop, which reads the client's next request and submits it. The thread that
    # finished must be idle by then, on top of the stack.
    pool = LastIdleThreadPool(4)
    try:
        _idle_threads(pool, 4)
        ran_on: list[int] = []
        last = threading.Event()

        def step(n: int) -> int:
            ran_on.append(threading.get_ident())
            return n

        def then(done: futures.Future) -> None:
            n = done.result()
            if n < 10:
                pool.submit(step, n + 1).add_done_callback(then)
            else:
                last.set()

        pool.submit(step, 0).add_done_callback(then)
        assert last.wait(30)
        assert len(ran_on) == 11 and len(set(ran_on)) == 1, ran_on
    finally:
        pool.shutdown()


def test_no_more_threads_than_asked_and_waiting_work_runs_in_order_of_arrival():
    pool = LastIdleThreadPool(2)
    try:
        go, held = _hold_all(pool, 2)
        order: list[int] = []
        waiting = [pool.submit(order.append, i) for i in range(5)]
        assert not any(f.done() for f in waiting)
        assert len(pool._threads) == 2
        go.set()
        for f in held + waiting:
            f.result(30)
        assert order == [0, 1, 2, 3, 4]
        assert len(pool._threads) == 2
    finally:
        pool.shutdown()


def test_an_error_goes_to_its_future_and_the_thread_serves_on():
    pool = LastIdleThreadPool(1)
    try:

        def fail() -> None:
            raise ValueError("bad request")

        with pytest.raises(ValueError, match="bad request"):
            pool.submit(fail).result(30)
        assert pool.submit(lambda a, b=0: a + b, 2, b=3).result(30) == 5
    finally:
        pool.shutdown()


def test_a_cancelled_future_is_skipped():
    pool = LastIdleThreadPool(1)
    try:
        go, _ = _hold_all(pool, 1)
        ran: list[str] = []
        skipped = pool.submit(ran.append, "skipped")
        kept = pool.submit(ran.append, "kept")
        assert skipped.cancel()
        go.set()
        kept.result(30)
        assert ran == ["kept"] and skipped.cancelled()
    finally:
        pool.shutdown()


def test_shutdown_lets_running_and_waiting_work_finish_then_refuses_more():
    pool = LastIdleThreadPool(2)
    go, held = _hold_all(pool, 2)
    waiting = pool.submit(lambda: "after")
    stopper = threading.Timer(0.2, go.set)
    stopper.start()
    pool.shutdown(wait=True)  # returns once the held work, then the waiting, are done
    assert all(f.done() for f in held) and waiting.result(0) == "after"
    assert not any(t.is_alive() for t in pool._threads)
    assert not any(t.daemon for t in pool._threads)  # a worker's exit waits for its turns
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(print)


def test_shutdown_can_cancel_waiting_work():
    pool = LastIdleThreadPool(1)
    go, held = _hold_all(pool, 1)
    waiting = pool.submit(lambda: "never")
    pool.shutdown(wait=False, cancel_futures=True)
    assert waiting.cancelled()
    go.set()
    assert held[0].result(30)
    pool._threads[0].join(30)
    assert not pool._threads[0].is_alive()


def test_idle_threads_end_at_shutdown():
    pool = LastIdleThreadPool(3)
    _idle_threads(pool, 3)
    pool.shutdown(wait=True)
    assert not any(t.is_alive() for t in pool._threads)


def test_max_workers_must_be_positive():
    with pytest.raises(ValueError, match="max_workers"):
        LastIdleThreadPool(0)


def test_a_process_that_never_shuts_its_pool_down_exits_once_running_work_is_done(tmp_path):
    # Its threads are not daemons (running turns commit before a worker exits), so
    # without the exit hook an idle one kept the process waiting for ever.
    done = tmp_path / "done"
    script = (
        "import time\n"
        "from api.thread_pool import LastIdleThreadPool\n"
        "pool = LastIdleThreadPool(3)\n"
        "assert pool.submit(lambda: 42).result(30) == 42\n"
        f"pool.submit(lambda: (time.sleep(0.3), open({str(done)!r}, 'w').close()))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert done.exists()  # the work running at exit finished first
