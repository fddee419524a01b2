"""Leases: a row claimed by one worker for a while, renewed while it works, cancellable.

The one lease mechanism of the server, used by turns (a session row, see
:mod:`api.services.turns`) and by background parse tasks (a document row, see
:mod:`api.services.parsing`). A leased table has three columns:

* ``lease_owner`` — who holds the row (:func:`new_owner`), ``NULL`` when free;
* ``lease_expires`` — epoch ms; a lease not renewed by then is free to take over
  (its holder died);
* ``cancel_requested`` — a flag any worker may raise; the holder's
  :class:`LeaseKeeper` sees it within one poll.

A claim is a conditional ``UPDATE ... WHERE`` :func:`lease_free` (plus the caller's
own conditions), so exactly one of several racing workers wins.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any

from peewee import Expression, Model, PeeweeException

from api.db import db, now_ms

log = logging.getLogger("agentcanvas.leases")

_HOST = socket.gethostname()[:24]
#: Polls without any lease before a keeper's thread sleeps until the next one.
_IDLE_POLLS = 20


def new_owner(unique: str | None = None) -> str:
    """A lease owner id unique to this claim: host, process and ``unique`` (random if not given)."""
    return f"{_HOST}:{os.getpid()}:{unique or uuid.uuid4().hex[:16]}"


def lease_free(model: type[Model], now: Any) -> Expression:
    """The condition "nobody holds a live lease on this row" (``now``: ms, or a marker)."""
    return model.lease_owner.is_null() | (model.lease_expires < now)


def lease_live(row: Model) -> bool:
    """True while ``row``'s lease is held and not expired."""
    return row.lease_owner is not None and row.lease_expires >= now_ms()


class LeaseKeeper:
    """Renews the leases this process holds on ``model``'s rows and polls their cancel flags.

    One daemon thread per keeper, started with the first lease and asleep while none
    is held. A lease is first looked at one ``poll_seconds`` after it is tracked, so
    short work costs the database nothing here. Each tick reads the cancel flags of
    the tracked leases in one query and pushes forward, in one ``UPDATE``, the expiry
    of leases renewed more than a third of a lease ago. Work whose lease is gone
    (taken over after an expiry, or the row deleted) is told to stop as well: it
    could not commit anyway.

    Args:
        model: the leased table (with the three columns of the module docstring).
        lease_ms: how long a lease lasts without renewal.
        poll_seconds: how often the cancel flags are read.
    """

    def __init__(self, model: type[Model], lease_ms: int, poll_seconds: float):
        self.model = model
        self.lease_ms = lease_ms
        self.poll_seconds = poll_seconds
        self._cond = threading.Condition()
        # owner -> (stop event, when its lease was last set, ms)
        self._held: dict[str, tuple[threading.Event, int]] = {}
        # owner -> how to give its lease back, for leases whose holder could not
        # (the database was down): tried every poll until the database answers.
        self._releases: dict[str, Callable[[], Any]] = {}
        #: the keeper's thread and its stop flag, while one runs
        self._thread: tuple[threading.Thread, threading.Event] | None = None

    def track(self, owner: str) -> threading.Event:
        """Start watching the lease ``owner``; the returned event is set to stop its work."""
        stop = threading.Event()
        with self._cond:
            self._held[owner] = (stop, now_ms())
            self._start()
            self._cond.notify()
        return stop

    def untrack(self, owner: str) -> None:
        with self._cond:
            self._held.pop(owner, None)

    def release_later(self, owner: str, release: Callable[[], Any]) -> None:
        """Give lease ``owner`` back as soon as the database answers again.

        For a holder whose own release (or commit) failed because the database was
        unreachable: ``release()`` — an ``UPDATE ... WHERE lease_owner = owner``,
        harmless if the lease is already gone — is tried every ``poll_seconds`` until
        it runs without a database error, so the row is free again within a poll of
        the database coming back instead of when the lease expires.
        """
        with self._cond:
            self._releases[owner] = release
            self._start()
            self._cond.notify()

    def _start(self) -> None:
        if self._thread is None:
            stop = threading.Event()
            thread = threading.Thread(
                target=self._loop,
                args=(stop,),
                name=f"agentcanvas-lease-keeper-{self.model.__name__}",
                daemon=True,
            )
            self._thread = (thread, stop)
            thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """End the keeper's thread within ``timeout`` seconds; whether it has ended.

        Leases still held are no longer renewed (they expire by themselves), and
        releases still pending are not tried again. The next :meth:`track` starts a
        new thread.
        """
        with self._cond:
            running, self._thread = self._thread, None
            self._releases.clear()
            if running is None:
                return True
            running[1].set()
            self._cond.notify_all()
        running[0].join(timeout)
        return not running[0].is_alive()

    def _release_pending(self) -> None:
        with self._cond:
            pending = dict(self._releases)
        for owner, release in pending.items():
            try:
                with db.connection_context():
                    release()
            except PeeweeException as exc:
                log.warning("lease %s not released yet, the database is unreachable: %s", owner, exc)
                return  # the database is still down: try the rest next tick
            with self._cond:
                self._releases.pop(owner, None)

    def _loop(self, stop: threading.Event) -> None:
        idle = 0
        while not stop.is_set():
            with self._cond:
                # Asleep only after a while without leases: waking this thread for each
                # short lease would cost the worker more than the lease itself.
                while not self._held and not self._releases and idle >= _IDLE_POLLS and not stop.is_set():
                    self._cond.wait()
                    idle = 0
            if stop.wait(self.poll_seconds):
                return
            if self._releases:
                self._release_pending()
            with self._cond:
                held = dict(self._held)
            if not held:
                idle += 1
                continue
            idle = 0
            try:
                self._tick(held)
            except PeeweeException as exc:
                # The database is unreachable for now; the lease has slack (a third
                # of it is renewed at a time), so try again next tick.
                log.warning("lease keeper could not reach the database: %s", exc)

    def _tick(self, held: dict[str, tuple[threading.Event, int]]) -> None:
        model = self.model
        owners = list(held)
        with db.connection_context():
            now = now_ms()
            due = [o for o, (_, renewed) in held.items() if now - renewed >= self.lease_ms // 3]
            if due:
                model.update(lease_expires=now + self.lease_ms).where(model.lease_owner.in_(due)).execute()
            rows = model.select(model.lease_owner, model.cancel_requested).where(
                model.lease_owner.in_(owners)
            )
            flagged = {r.lease_owner for r in rows if r.cancel_requested}
            present = {r.lease_owner for r in rows}
        with self._cond:
            for owner in owners:
                entry = self._held.get(owner)
                if entry is None:
                    continue
                if owner in due:
                    self._held[owner] = (entry[0], now)
                if owner in flagged or owner not in present:
                    entry[0].set()
