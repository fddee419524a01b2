"""The time a turn may still wait, and its cancel flag: one object every wait asks.

A running canvas holds ``canvas.deadline``: the turn's wall-clock budget
(``max_seconds``) and the cancel flag. Anything in a turn that waits — an HTTP call,
an LLM stream, a retry's pause, a template render, a tool — asks it, so that a turn
ends within about :data:`POLL_SECONDS` of its deadline or of a cancel, whatever the
other side does::

    wait = canvas.deadline.within(2.0, "timeout_seconds")  # a component's own timeout
    wait.remaining()   # seconds left (the nearer of the two ends), never negative
    wait.check()       # raises if cancelled or past either end
    wait.sleep(1.5)    # a pause that wakes for a cancel and stops at the deadline
    wait.step()        # the timeout for one blocking step: at most POLL_SECONDS

:meth:`Deadline.check` raises, naming the limit that was hit:

* :class:`~agent.errors.Cancelled` when the cancel flag is up (checked first);
* :class:`~agent.errors.DeadlineExceeded` (a ``LimitError``) when the turn's
  ``max_seconds`` is spent: the run ends, no retry or ``exception_method`` applies;
* :class:`~agent.errors.ComponentTimeout` (a ``ComponentError``) when a budget given to
  :meth:`Deadline.within` is spent: a component failure like any other.

A blocking call that cannot itself be interrupted is made in slices of
:meth:`Deadline.step` seconds (a socket timeout, a ``select``, a queue ``get``), with a
:meth:`Deadline.check` between slices; :func:`call` and :func:`iterate` do that for a
blocking function or iterator whose waits cannot be sliced (another library's client).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from agent.errors import Cancelled, ComponentTimeout, DeadlineExceeded

T = TypeVar("T")

#: The longest single blocking step: a cancel or a deadline is noticed this late at most.
POLL_SECONDS = 0.1


class Deadline:
    """A wall-clock budget and a cancel flag (see the module docstring).

    Args:
        seconds: the budget from now; ``None`` for none.
        cancelled: a callable that says whether the run was cancelled (read at each check).
        limit: the setting the budget comes from, for messages (``"max_seconds"``).
    """

    def __init__(
        self,
        seconds: float | None = None,
        *,
        cancelled: Callable[[], bool] | None = None,
        limit: str = "max_seconds",
    ):
        self.seconds = seconds
        self.limit = limit
        self._end = math.inf if seconds is None else time.monotonic() + float(seconds)
        self._cancelled = cancelled
        self._parent: Deadline | None = None

    def within(self, seconds: float | None, limit: str) -> Deadline:
        """A budget of ``seconds`` more inside this one (a component's own timeout).

        The child ends at the nearer of the two ends and shares the cancel flag; its
        :meth:`check` names ``limit`` when its own budget runs out first.
        """
        child = Deadline(seconds, limit=limit)
        child._parent = self
        return child

    # ------------------------------------------------------------------ asking
    def cancelled(self) -> bool:
        d: Deadline | None = self
        while d is not None:
            if d._cancelled is not None and d._cancelled():
                return True
            d = d._parent
        return False

    def remaining(self) -> float:
        """Seconds left before the nearest end (``inf`` without one); never negative."""
        end, d = math.inf, self
        while d is not None:
            end = min(end, d._end)
            d = d._parent
        return max(0.0, end - time.monotonic())

    def check(self) -> None:
        """Raise if cancelled or past an end; the error names the limit (module docstring)."""
        if self._parent is None:  # the turn's own deadline: asked before every component
            if self._cancelled is not None and self._cancelled():
                raise Cancelled()
            if time.monotonic() >= self._end:
                raise self._error()
            return
        if self.cancelled():
            raise Cancelled()
        now = time.monotonic()
        chain, d = [], self
        while d is not None:
            chain.append(d)
            d = d._parent
        for d in reversed(chain):  # the turn's limit first: it ends the run
            if now >= d._end:
                raise d._error()

    def _error(self) -> Exception:
        if self._parent is None:
            return DeadlineExceeded(f"the turn ran longer than {self.seconds:g} s (limit {self.limit})")
        return ComponentTimeout(f"did not finish within {self.seconds:g} s ({self.limit})", self.seconds)

    def step(self, at_most: float = POLL_SECONDS) -> float:
        """The timeout for one blocking step: ``at_most``, less when the end is nearer.

        Call :meth:`check` first; a step of 0 means the end has come.
        """
        return min(at_most, self.remaining())

    # ------------------------------------------------------------------ waiting
    def sleep(self, seconds: float) -> None:
        """Pause ``seconds``; raise at once on a cancel, and at the end if it comes first."""
        until = time.monotonic() + max(0.0, float(seconds))
        while True:
            self.check()
            left = until - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, self.step()) or 0.001)

    def wait(self, event: threading.Event) -> None:
        """Wait for ``event``; raises (:meth:`check`) on a cancel or at the end."""
        while not event.is_set():
            self.check()
            event.wait(self.step() or 0.001)


def unlimited() -> Deadline:
    """A deadline that never ends and is never cancelled (a canvas not running): one
    shared object (a deadline never changes once made)."""
    return _UNLIMITED


_UNLIMITED = Deadline()


_DONE = object()


def call(deadline: Deadline, fn: Callable[[], T], abandon: Callable[[], Any] | None = None) -> T:
    """``fn()`` run in a helper thread; this thread waits for it under ``deadline``.

    For a blocking call whose waits cannot be sliced (another library's client). On a
    cancel or at the end the helper is left to finish alone and ``abandon`` (e.g. close
    its connection) is called; give ``fn`` its own timeout so the helper ends too.
    """
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed over to the waiting thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name="agentcanvas-deadline-call", daemon=True).start()
    try:
        deadline.wait(done)
    except BaseException:
        _quietly(abandon)
        raise
    if "error" in box:
        raise box["error"]
    return box["value"]


def iterate(
    deadline: Deadline,
    items: Iterator[T],
    abandon: Callable[[], Any] | None = None,
    idle_seconds: float | None = None,
    idle_limit: str = "timeout",
) -> Iterator[T]:
    """The items of a blocking iterator, read by a helper thread, under ``deadline``.

    With ``idle_seconds``, each item must come within that many seconds of the
    previous one (``idle_limit`` names the setting in the error). On a cancel, at an
    end, or when the caller stops early, ``abandon`` is called (close the stream) and
    the helper is left to finish alone.
    """
    channel: queue.Queue = queue.Queue(maxsize=64)
    stop = threading.Event()

    def pump() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        channel.put(("item", item), timeout=POLL_SECONDS)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            channel.put(("end", None))
        except BaseException as e:  # noqa: BLE001 - handed over to the reading thread
            channel.put(("error", e))

    threading.Thread(target=pump, name="agentcanvas-deadline-iterate", daemon=True).start()
    try:
        while True:
            wait = deadline.within(idle_seconds, idle_limit) if idle_seconds else deadline
            while True:
                wait.check()
                try:
                    kind, value = channel.get(timeout=wait.step() or 0.001)
                    break
                except queue.Empty:
                    continue
            if kind == "end":
                return
            if kind == "error":
                if is_timeout(value):
                    raise_if_spent(wait)  # the transport's timeout was this wait's own end
                raise value
            yield value
    except BaseException:
        stop.set()
        _quietly(abandon)
        raise
    finally:
        stop.set()


def is_timeout(e: BaseException) -> bool:
    """Whether ``e`` is a timeout: ``TimeoutError``, or a class of a transport named so."""
    return isinstance(e, TimeoutError) or any("Timeout" in t.__name__ for t in type(e).__mro__)


def raise_if_spent(wait: Deadline) -> None:
    """Raise ``wait``'s own error when a transport's timeout ended at ``wait``'s end.

    A request's timeout is the time its wait had left, so the transport may give up a
    moment before the wait is past its end, or report it a moment before the waiting
    thread looks at the clock; the error must still name the limit that ran out (a turn's
    ``max_seconds``, an ``llm.timeout_seconds``), not the transport's. A timeout well
    before the end (a connect timeout) is left to the caller.
    """
    left = wait.remaining()
    if left <= POLL_SECONDS:
        wait.sleep(left + POLL_SECONDS)


def _quietly(fn: Callable[[], Any] | None) -> None:
    if fn is None:
        return
    try:
        fn()
    except Exception:  # noqa: BLE001 - closing a broken connection may fail too
        pass
