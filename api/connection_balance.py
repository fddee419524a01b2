"""Keep-alive connections spread over gunicorn's threaded workers (issue 15).

gunicorn's gthread workers share one listening socket. A waiting connection wakes every
worker's poller; the first to run accepts it, one a turn of its loop, for as long as
connections wait. A burst of keep-alive clients can so land all on one worker, and
kept alive they stay there: one process runs Python on one core at a time, so that
worker serves them on one core while the other idles.

**Chosen: least connections.** Each worker writes how many connections it holds on a
board the workers share (an anonymous shared mmap that the master makes before it forks
them) and stops accepting while another live worker holds fewer. 16 connections opened
at once, one request on each, 2 workers x 8 threads, a loaded machine (load 9-15):

* gthread as it is, 12 bursts: 16/0 twice, 15/1 three times, 14/2 twice, 11/5, 10/6,
  9/7 twice, 8/8 once (64 connections: 64/0);
* one ``SO_REUSEPORT`` socket per worker (gunicorn's ``reuse_port``), 30 bursts: 8/8
  13 times, 9/7 4, 10/6 9, 11/5 3, 12/4 once (64: 34/30). The kernel picks a socket by a
  hash of the connection's addresses, whatever each worker holds; the connections queued
  on a worker's socket are reset when it exits; each worker binds the port itself, so
  port 0 cannot be used;
* this, 12 bursts: 8/8 each time (64: 32/32).

Stopping at ``threads`` connections a worker was not taken: 3 clients could still sit on
one worker (one core) while the other has none; it is the process, not the thread, that
connections need spreading over.

The rules, evaluated at each turn of a worker's loop (``ThreadWorker.run`` calls
``notify()`` at the top of each, and switches accepting on or off right after):

* write its connection count and a heartbeat on the board;
* find the live worker (heartbeat at most ``STALE_SECONDS`` old) holding the fewest
  connections. If it holds fewer than this one, stop accepting, and if it does not accept
  (it stopped for a worker that has taken more since), wake it through its pipe. The stop
  is written before that flag is read, so of two workers stopping at once the second
  sees the first stopped and wakes it. (Going on accepting until the woken worker runs
  was tried: on a loaded machine it ran late, and the other took 11 to 14 of 16.)
* otherwise accept, as gthread does (below ``worker_connections``).

The live worker holding the fewest connections never stops for another: it accepts, or
was woken and accepts at its next turn. So no connection waits in the backlog for long,
however many clients (64 on 2 x 8: 32 a worker, each worker's threads taking their
requests in turn as gthread does). A worker that hangs or dies stops beating and is
passed over within ``STALE_SECONDS``; the master frees its seat when it reaps it. The
board costs about 3 us a turn of the loop, about two turns a request. With one worker
``run_gunicorn`` uses gthread's own worker, as before.
"""

from __future__ import annotations

import mmap
import os
import selectors
import time
from typing import Any, NamedTuple

from gunicorn.workers.gthread import ThreadWorker

from api.thread_pool import LastIdleThreadPool

# The hooks used here (an accept switch, set_accept_enabled, and the count nr_conns) are
# those of gthread's loop in gunicorn 27, which setup.cfg pins.
# A worker's loop turns at least once a second (its poller waits 1 s at most).
STALE_SECONDS = 3.0
STALE_NS = int(STALE_SECONDS * 1e9)
_PID, _CONNECTIONS, _ACCEPTING, _BEAT = range(4)
_FIELDS = 4


class Seat(NamedTuple):
    """One other worker as the board shows it."""

    index: int
    connections: int
    accepting: bool


class ConnectionBoard:
    """Each worker's connection count, accepting flag and heartbeat, in shared memory.

    Made in the master before it forks the workers, so that every worker maps the same
    memory and inherits every seat's wake-up pipe. ``seat`` (gunicorn's ``pre_fork``
    hook) gives a worker a free seat, ``unseat`` (from ``child_exit``) takes it back:
    both run in the master only. A worker forked when every seat is taken (more workers
    through ``TTIN``) gets none and accepts as gthread does, unseen by the others.
    """

    def __init__(self, seats: int) -> None:
        self._memory = mmap.mmap(-1, seats * _FIELDS * 8)  # anonymous and MAP_SHARED
        self._cells = memoryview(self._memory).cast("q")
        self._pipes = [os.pipe() for _ in range(seats)]
        for read_end, write_end in self._pipes:
            os.set_blocking(read_end, False)
            os.set_blocking(write_end, False)
        self._free = list(range(seats))
        self.seats = seats

    # ------------------------------------------------------------ in the master
    def seat(self, _server: Any, worker: Any) -> None:
        """gunicorn's ``pre_fork``: hand the worker about to fork a free seat, if any."""
        if self._free and isinstance(worker, BalancedThreadWorker):
            worker.board, worker.board_seat = self, self._free.pop(0)

    def unseat(self, worker: Any) -> None:
        """Free a reaped worker's seat (from gunicorn's ``child_exit``)."""
        index = getattr(worker, "board_seat", None)
        if getattr(worker, "board", None) is self and index is not None:
            self.leave(index)
            self._free.append(index)

    # ------------------------------------------------------------ in a worker
    def sit(self, index: int, pid: int) -> None:
        base = index * _FIELDS
        self._cells[base + _CONNECTIONS] = 0
        self._cells[base + _ACCEPTING] = 0
        self._cells[base + _BEAT] = time.monotonic_ns()
        self._cells[base + _PID] = pid

    def leave(self, index: int) -> None:
        self._cells[index * _FIELDS + _PID] = 0

    def beat(self, index: int, connections: int) -> None:
        base = index * _FIELDS
        self._cells[base + _CONNECTIONS] = connections
        self._cells[base + _BEAT] = time.monotonic_ns()

    def mark_accepting(self, index: int, accepting: bool) -> None:
        self._cells[index * _FIELDS + _ACCEPTING] = accepting

    def accepting(self, index: int) -> bool:
        return bool(self._cells[index * _FIELDS + _ACCEPTING])

    def least_loaded_other(self, index: int) -> Seat | None:
        """The live worker other than ``index`` holding the fewest connections, if any."""
        cells = self._cells.tolist()  # one copy: cheaper than reading the cells one by one
        live_since = time.monotonic_ns() - STALE_NS
        best = None
        for base in range(0, len(cells), _FIELDS):
            if (
                cells[base + _PID]
                and cells[base + _BEAT] >= live_since
                and base != index * _FIELDS
                and (best is None or cells[base + _CONNECTIONS] < cells[best + _CONNECTIONS])
            ):
                best = base
        if best is None:
            return None
        return Seat(best // _FIELDS, cells[best + _CONNECTIONS], bool(cells[best + _ACCEPTING]))

    def wake_fd(self, index: int) -> int:
        return self._pipes[index][0]

    def wake(self, index: int) -> None:
        """Make that worker's loop turn (its poller watches the seat's pipe)."""
        try:
            os.write(self._pipes[index][1], b"\0")
        except BlockingIOError:  # the pipe is full: it has been woken already
            pass


class BalancedThreadWorker(ThreadWorker):
    """gunicorn's gthread worker that leaves new connections to a worker holding fewer,
    and gives each request to the request thread that went idle last
    (:class:`api.thread_pool.LastIdleThreadPool`).

    The master's ``pre_fork`` hook (``ConnectionBoard.seat``) sets ``board`` and
    ``board_seat``; without them (one worker) connections are accepted as gthread does.
    """

    board: ConnectionBoard | None = None
    board_seat: int | None = None
    _yielding = False

    def get_thread_pool(self) -> LastIdleThreadPool:
        """gunicorn's hook for the pool its requests run in."""
        return LastIdleThreadPool(self.cfg.threads)

    def run(self) -> None:
        if self.board is not None:
            self.board.sit(self.board_seat, os.getpid())
            self.poller.register(self.board.wake_fd(self.board_seat), selectors.EVENT_READ, self._woken)
        super().run()

    def _woken(self, pipe: int) -> None:
        """Called by the poller when another worker woke this one; the loop's turn is the point."""
        try:
            os.read(pipe, 512)
        except BlockingIOError:
            pass

    def notify(self) -> None:
        """The heartbeat, at the top of each turn of the loop: decide whether to accept too."""
        super().notify()
        board = self.board
        if board is None or not self.alive:
            return
        board.beat(self.board_seat, self.nr_conns)
        least = board.least_loaded_other(self.board_seat)
        self._yielding = least is not None and least.connections < self.nr_conns
        if not self._yielding:
            return
        self.set_accept_enabled(False)
        # Read after writing the stop: of two workers stopping at once, the second sees
        # the first stopped and wakes it, and that one looks again.
        if not board.accepting(least.index):
            board.wake(least.index)

    def set_accept_enabled(self, enabled: bool) -> None:
        """gthread's switch, refused while yielding; the result is written on the board."""
        super().set_accept_enabled(enabled and not self._yielding)
        if self.board is None:
            return
        if self.alive:
            self.board.mark_accepting(self.board_seat, self._accepting)
        else:  # stopping: no longer a worker to leave connections to, nor to wake
            self.board.leave(self.board_seat)
