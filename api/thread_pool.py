"""The request threads of a gunicorn worker, the thread that went idle last served first.

gunicorn's gthread worker hands each request to a ``concurrent.futures``
``ThreadPoolExecutor``. There every idle thread waits on one queue, and the one that
has waited longest takes the next request: one client's requests, sent one after the
other, went round all of a worker's threads (``--threads``, 8 by default). Each thread
has its own database connection, and an SQLite connection drops its page cache when
another connection has written since its last transaction, so each of those requests
found a connection whose cache the seven others had made stale, and code and data
warmed by the request before sat with another thread. Measured side by side over HTTP
(1 keep-alive client, SQLite, 1 worker x 8 threads, the intake form's turn; two runs of
10 and 12 paired rounds): with :class:`LastIdleThreadPool` the worker's CPU time per
request was 10-12% lower than with the stdlib's pool (median of the paired ratios; the
app's own part 13%), about what one thread alone gave. Requests per second did not
follow (-3% and +2%, within the noise of a shared virtual machine): at one client the
saved time was not all on the request's path. The floor app of ``bench/http.py``, which
reads and writes fewer pages, changed little.

:class:`LastIdleThreadPool` keeps its idle threads on a stack and gives a request to the
one on top, the last to finish. A thread goes back on the stack before it marks its
work's future done: gunicorn's callback on that future is what leads to the client's
next request being read, which so finds the thread that served the last one on top
(marked done first, under load the next request often went to another). When no
thread is idle, requests wait in order of arrival (first come, first served) as before.
It starts threads only as needed, up to ``max_workers``, as the stdlib's pool does, and
behaves as it does otherwise: a future per call, cancelled futures skipped,
:meth:`shutdown` (``wait``, ``cancel_futures``) letting running and waiting work finish
unless cancelled. Its threads are not daemons: a worker that exits lets its running
turns commit (``api/services/turns.py``); its idle threads end as the interpreter exits,
even without a shutdown (:func:`_at_exit`). gunicorn builds it through
``ThreadWorker.get_thread_pool``, the hook it documents for this
(:class:`api.connection_balance.BalancedThreadWorker`).
"""

from __future__ import annotations

import atexit
import collections
import threading
import weakref
from collections.abc import Callable
from concurrent import futures
from typing import Any

#: Every pool of this process, shut down as the interpreter exits (:func:`_at_exit`).
_POOLS: weakref.WeakSet[LastIdleThreadPool] = weakref.WeakSet()


def _at_exit() -> None:
    """Let the idle threads of every pool end as the interpreter exits.

    Its threads are not daemons, and the interpreter waits for those before it exits: an
    idle thread would wait for work for ever, and so would the process, when it exits
    without a :meth:`LastIdleThreadPool.shutdown` (gunicorn's worker does not call it on
    every way out: an abort raises ``SystemExit`` through its loop). Run where the
    stdlib's pool runs its own: before the interpreter waits for the threads
    (``threading._register_atexit``, as ``concurrent.futures.thread`` does); running work
    still finishes, as it does there.
    """
    for pool in list(_POOLS):
        pool.shutdown(wait=False)


# A private hook, the one concurrent.futures uses for the same; atexit (which runs only
# after the threads are waited for) where an interpreter lacks it.
getattr(threading, "_register_atexit", atexit.register)(_at_exit)


class _Seat:
    """One thread's place on the idle stack: the lock it sleeps on, the work it wakes to."""

    __slots__ = ("wake", "work")

    def __init__(self) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()  # held: the thread sleeps until a submitter releases it
        self.work: tuple | None = None


class LastIdleThreadPool(futures.Executor):
    """A ``ThreadPoolExecutor`` whose next piece of work goes to the thread idle the least long."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "request") -> None:
        if max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._idle: list[_Seat] = []  # a stack: the last to go idle on top
        self._waiting: collections.deque[tuple] = collections.deque()  # no thread was idle
        self._threads: list[threading.Thread] = []
        self._shut = False
        _POOLS.add(self)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future:
        future: futures.Future = futures.Future()
        work = (future, fn, args, kwargs)
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._idle:
                seat = self._idle.pop()
                seat.work = work
                seat.wake.release()
            elif len(self._threads) < self._max_workers:
                thread = threading.Thread(
                    target=self._serve,
                    args=(_Seat(), work),
                    name=f"{self._prefix}-{len(self._threads)}",
                )
                thread.start()
                self._threads.append(thread)
            else:
                self._waiting.append(work)
        return future

    def _serve(self, seat: _Seat, work: tuple | None) -> None:
        while work is not None:
            future, fn, args, kwargs = work
            result = error = None
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - handed to the future, as the stdlib pool does
                    error = exc
            else:
                future = None  # cancelled: nothing to report
            del fn, args, kwargs  # nothing of the finished work kept while idle
            # Back on the idle stack (or on to waiting work) before the future is done:
            # its callbacks may lead to the next request (gunicorn's hands the connection
            # back to its loop, which reads the client's next request), which then finds
            # this thread on top.
            with self._lock:
                work = self._waiting.popleft() if self._waiting else None
                idle = work is None and not self._shut
                if idle:
                    self._idle.append(seat)
            if future is not None:
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)
            del future, result, error
            if idle:
                seat.wake.acquire()
                work, seat.work = seat.work, None  # None: shut down

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            if cancel_futures:
                while self._waiting:
                    self._waiting.popleft()[0].cancel()
            for seat in self._idle:
                seat.work = None
                seat.wake.release()
            self._idle.clear()
            threads = list(self._threads)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()
