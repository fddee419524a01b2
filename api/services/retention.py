"""Retention (docs/design.md §15): idle sessions expire, deleted ones are swept, keyed memory ages out.

* **Deleting** a session removes its row at once, so no reader sees it again, and
  puts its id in ``session_trash`` in the same transaction (:func:`trash_sessions`).
  What belonged to it — messages, kept snapshots — is removed later by the sweep.
* **Expiry**: a session idle (``update_time``) for longer than its agent's
  ``session_ttl_seconds``, or else the server's ``session.ttl_seconds``
  (``AGENTCANVAS_SESSION_TTL_SECONDS``; 0 = forever), is trashed by the sweep.
  ``update_time`` has no index (every turn sets it: on SQLite its index entry was a
  page of the WAL per committed request, 1 of 8.9). The sweep finds the sessions that
  may have expired by ``Session.expiry_mark``, indexed, a time at or before
  ``update_time`` that turns never write; of those it trashes the ones whose
  ``update_time`` says they expired and moves the others' mark up to their
  ``update_time``, so an active session comes up again only one lifetime later.
* **Keyed memory** (``memory_key``) lives ``memory.ttl_seconds``
  (``AGENTCANVAS_MEMORY_TTL_SECONDS``; 0 = forever) from when it was written.
* **Files** uploaded for conversations go with the last session that used them, and an
  upload no session took within the session lifetime goes too (the rules and why:
  :mod:`api.services.files`).

:func:`sweep` does the work in **bounded batches**, each its own short transaction,
so a running turn is never held up by more than one batch. Only one worker sweeps at
a time: the one holding the ``sweep`` lease, a :class:`~api.db.WorkerLease` row taken
and renewed with the same mechanism as a turn's lease (:mod:`api.services.leases`).
Every server process tries every ``session.sweep_interval_seconds``
(:class:`Sweeper`); ``agentcanvas sweep [--batch N]`` runs one sweep from cron.

Only SQL that every MySQL-compatible engine accepts: ids are selected with ``LIMIT``
first and then deleted by id (MySQL refuses ``LIMIT`` inside ``IN (subquery)``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from peewee import JOIN, PeeweeException, Select, fn

from api.db import (
    Agent,
    MemoryEntry,
    MessageLog,
    Session,
    SessionFile,
    SessionSnapshot,
    SessionTrash,
    UploadFile,
    WorkerLease,
    db,
    now_ms,
    write_transaction,
)
from api.services.files import FileSettings, delete_unused_files, remove_stored_files
from api.services.leases import LeaseKeeper, lease_free, new_owner

log = logging.getLogger("agentcanvas.retention")

SWEEP_LEASE = "sweep"
MAX_BATCH = 10_000


@dataclass
class RetentionSettings:
    """What the sweep removes and how much at a time (from the app's config)."""

    session_ttl_seconds: int = 0
    memory_ttl_seconds: int = 0
    batch: int = 500
    lease_seconds: float = 30.0
    #: Where files are stored (a directory store's files are removed from there).
    files: FileSettings | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> RetentionSettings:
        return cls(
            session_ttl_seconds=int(config["SESSION_TTL_SECONDS"]),
            memory_ttl_seconds=int(config["MEMORY_TTL_SECONDS"]),
            batch=int(config["SWEEP_BATCH"]),
            lease_seconds=float(config["LEASE_SECONDS"]),
            files=FileSettings.from_config(config),
        )


@dataclass
class SweepReport:
    """What one sweep did: ``expired`` sessions trashed, ``purged`` trashed sessions cleared
    out (their messages, snapshots and files gone), ``memory_entries`` removed, uploaded
    ``files`` removed, ``batches`` run; ``skipped`` when another worker held the sweep lease."""

    expired: int = 0
    purged: int = 0
    memory_entries: int = 0
    files: int = 0
    batches: int = 0
    skipped: bool = False
    expired_ids: set[str] = field(default_factory=set, repr=False)
    purged_ids: set[str] = field(default_factory=set, repr=False)

    @property
    def removed(self) -> int:
        """Sessions gone for good in this sweep: expired ones, and deleted ones cleared out."""
        return len(self.expired_ids | self.purged_ids)

    @property
    def deleted(self) -> int:
        """Sessions deleted earlier (through the API) and cleared out in this sweep."""
        return len(self.purged_ids - self.expired_ids)

    def as_dict(self) -> dict:
        return {
            "removed": self.removed,
            "expired": self.expired,
            "purged": self.purged,
            "memory_entries": self.memory_entries,
            "files": self.files,
            "batches": self.batches,
            "skipped": self.skipped,
        }


def trash_sessions(session_ids: Select | list[str], now: int | None = None) -> int:
    """Delete these sessions now and queue what belonged to them for the sweep.

    Call inside the caller's write transaction. ``session_ids`` is a list or a
    ``SELECT`` of ``Session.id``. Returns how many sessions were deleted.
    """
    now = now_ms() if now is None else now
    ids = session_ids if isinstance(session_ids, list) else [row.id for row in session_ids]
    if not ids:
        return 0
    for start in range(0, len(ids), 1000):
        part = ids[start : start + 1000]
        SessionTrash.insert_many(
            [{"session_id": sid, "deleted_time": now} for sid in part]
        ).on_conflict_ignore().execute()
        Session.delete().where(Session.id.in_(part)).execute()
    return len(ids)


def _expired(now: int, shortest_ttl: int, settings: RetentionSettings, exactly: bool) -> Select:
    """Sessions not running a turn that may be idle past their agent's lifetime (the
    server's when the agent has none), found by their ``expiry_mark``; ``exactly``: only
    those that are, by their ``update_time``. ``shortest_ttl``: the shortest lifetime
    any session has (seconds), which bounds the mark's index range."""
    ttl = fn.COALESCE(Agent.session_ttl_seconds, settings.session_ttl_seconds)
    idle_since = Session.update_time if exactly else Session.expiry_mark
    return (
        Session.select(Session.id)
        .join(Agent, JOIN.LEFT_OUTER, on=(Session.agent_id == Agent.id))
        .where(
            (Session.expiry_mark < now - shortest_ttl * 1000)
            & (ttl > 0)
            & (idle_since < now - ttl * 1000)
            # Leases are judged by the real clock, whatever time ``now`` judges idleness by.
            & lease_free(Session, now_ms())
        )
    )


def _shortest_ttl(settings: RetentionSettings) -> int | None:
    """The shortest session lifetime in force (the server's, or an agent's own), in
    seconds; None when no session can expire."""
    lifetimes = [settings.session_ttl_seconds] if settings.session_ttl_seconds > 0 else []
    shortest = Agent.select(fn.MIN(Agent.session_ttl_seconds)).where(Agent.session_ttl_seconds > 0).scalar()
    if shortest is not None:
        lifetimes.append(shortest)
    return min(lifetimes) if lifetimes else None


def _expire(now: int, shortest_ttl: int, settings: RetentionSettings, report: SweepReport) -> bool:
    """Trash one batch of expired sessions, and move up the mark of the sessions found by
    it that were used since; false when none was found."""
    ids = [
        row.id
        for row in _expired(now, shortest_ttl, settings, exactly=False)
        .order_by(Session.expiry_mark)
        .limit(settings.batch)
    ]
    if not ids:
        return False
    with write_transaction():
        # Checked in the transaction: a turn that started meanwhile keeps its session.
        still = [
            row.id for row in _expired(now, shortest_ttl, settings, exactly=True).where(Session.id.in_(ids))
        ]
        report.expired += trash_sessions(still, now)
        used = sorted(set(ids) - set(still))
        if used:
            # Still a lower bound of update_time (the statement reads it as it writes).
            Session.update(expiry_mark=Session.update_time).where(Session.id.in_(used)).execute()
    report.expired_ids.update(still)
    report.batches += 1
    return True


def _purge(settings: RetentionSettings, report: SweepReport) -> bool:
    """Remove what one batch of trashed sessions left behind; false when the trash is empty."""
    ids = [
        row.session_id
        for row in SessionTrash.select(SessionTrash.session_id)
        .order_by(SessionTrash.deleted_time)
        .limit(settings.batch)
    ]
    if not ids:
        return False
    with write_transaction():
        MessageLog.delete().where(MessageLog.session_id.in_(ids)).execute()
        SessionSnapshot.delete().where(SessionSnapshot.session_id.in_(ids)).execute()
        used = SessionFile.select(SessionFile.file_id).where(SessionFile.session_id.in_(ids))
        file_ids = sorted({row.file_id for row in used})
        SessionFile.delete().where(SessionFile.session_id.in_(ids)).execute()
        gone = delete_unused_files(file_ids)
        SessionTrash.delete().where(SessionTrash.session_id.in_(ids)).execute()
    remove_stored_files(gone, settings.files)
    report.files += len(gone)
    report.purged += len(ids)
    report.purged_ids.update(ids)
    report.batches += 1
    return True


def _forget_unused_uploads(now: int, settings: RetentionSettings, report: SweepReport) -> bool:
    """Remove one batch of uploads that no session took within the session lifetime (the
    agent's, else the server's); false when none is left."""
    ttl = fn.COALESCE(Agent.session_ttl_seconds, settings.session_ttl_seconds)
    used = SessionFile.select(SessionFile.file_id).where(SessionFile.file_id == UploadFile.id)
    ids = [
        row.id
        for row in UploadFile.select(UploadFile.id)
        .join(Agent, JOIN.LEFT_OUTER, on=(UploadFile.agent_id == Agent.id))
        .where(
            UploadFile.sweepable & (ttl > 0) & (UploadFile.create_time < now - ttl * 1000) & ~fn.EXISTS(used)
        )
        .order_by(UploadFile.create_time)
        .limit(settings.batch)
    ]
    if not ids:
        return False
    with write_transaction():
        gone = delete_unused_files(ids)
    remove_stored_files(gone, settings.files)
    report.files += len(gone)
    report.batches += 1
    return bool(gone)


def _forget_memory(now: int, settings: RetentionSettings, report: SweepReport) -> bool:
    """Remove one batch of keyed memory older than its lifetime; false when none is left."""
    if settings.memory_ttl_seconds <= 0:
        return False
    cutoff = now - settings.memory_ttl_seconds * 1000
    ids = [
        row.id
        for row in MemoryEntry.select(MemoryEntry.id)
        .where((MemoryEntry.create_time < cutoff) & MemoryEntry.memory_id.is_null())
        .order_by(MemoryEntry.create_time)
        .limit(settings.batch)
    ]
    if not ids:
        return False
    with write_transaction():
        report.memory_entries += MemoryEntry.delete().where(MemoryEntry.id.in_(ids)).execute()
    report.batches += 1
    return True


def _take_lease(owner: str, now: int, lease_ms: int) -> bool:
    WorkerLease.insert(name=SWEEP_LEASE, lease_owner=None, lease_expires=0).on_conflict_ignore().execute()
    taken = (
        WorkerLease.update(lease_owner=owner, lease_expires=now + lease_ms, cancel_requested=False)
        .where((WorkerLease.name == SWEEP_LEASE) & lease_free(WorkerLease, now))
        .execute()
    )
    return taken == 1


def _give_back(owner: str) -> None:
    WorkerLease.update(lease_owner=None, lease_expires=0).where(
        (WorkerLease.name == SWEEP_LEASE) & (WorkerLease.lease_owner == owner)
    ).execute()


_keepers: dict[int, LeaseKeeper] = {}
_keepers_lock = threading.Lock()


def _keeper(lease_ms: int) -> LeaseKeeper:
    """The process's keeper of the sweep lease (one per lease length)."""
    with _keepers_lock:
        keeper = _keepers.get(lease_ms)
        if keeper is None:
            keeper = _keepers[lease_ms] = LeaseKeeper(WorkerLease, lease_ms, 0.5)
        return keeper


def stop_keepers(timeout: float = 10.0) -> bool:
    """End the threads of the sweep lease's keepers (the next sweep starts them again);
    whether all ended within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    with _keepers_lock:
        keepers = list(_keepers.values())
    return all([keeper.stop(max(0.0, deadline - time.monotonic())) for keeper in keepers])


def sweep(
    settings: RetentionSettings,
    now: int | None = None,
    between_batches: Callable[[SweepReport], None] | None = None,
) -> SweepReport:
    """One sweep: expired sessions, then the trash (with the files no session uses any
    more), then old keyed memory, then uploads no session took, batch by batch.

    Args:
        settings: lifetimes and the batch size.
        now: the time to judge expiry by, epoch ms (tests pass their own clock).
        between_batches: called after each batch (tests look at the database there).

    Returns the report; ``skipped`` when another worker holds the sweep lease. Needs
    an open database connection.
    """
    now = now_ms() if now is None else now
    report = SweepReport()
    lease_ms = int(settings.lease_seconds * 1000)
    owner = new_owner()
    if not _take_lease(owner, now_ms(), lease_ms):
        report.skipped = True
        return report
    keeper = _keeper(lease_ms)
    stop = keeper.track(owner)
    try:
        steps = [lambda: _purge(settings, report), lambda: _forget_memory(now, settings, report)]
        shortest_ttl = _shortest_ttl(settings)
        if shortest_ttl is not None:
            steps.insert(0, lambda: _expire(now, shortest_ttl, settings, report))
            steps.append(lambda: _forget_unused_uploads(now, settings, report))
        for step in steps:
            while not stop.is_set() and step():
                if between_batches is not None:
                    between_batches(report)
        if report.expired:
            # What the expired sessions left behind goes in this same sweep.
            while not stop.is_set() and _purge(settings, report):
                if between_batches is not None:
                    between_batches(report)
    finally:
        keeper.untrack(owner)
        try:
            _give_back(owner)
        except PeeweeException:
            log.warning("could not give back the sweep lease; it expires by itself")
    return report


class Sweeper:
    """The background sweep of one server process: every ``interval`` seconds it tries to
    take the sweep lease and, if it gets it, sweeps (see :func:`sweep`).

    Args:
        settings: what to sweep.
        interval: seconds between attempts (0: no background sweep; cron runs
            ``agentcanvas sweep`` instead).
    """

    def __init__(self, settings: RetentionSettings, interval: float):
        self.settings = settings
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.interval <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="agentcanvas-sweeper", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop sweeping; wait up to ``timeout`` seconds for a sweep under way to end.
        Whether the thread has ended."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with db.connection_context():
                    report = sweep(self.settings)
                if report.batches:
                    log.info("sweep: %s", report.as_dict())
            except PeeweeException as exc:
                log.warning("sweep could not reach the database: %s", exc)
            except Exception:  # noqa: BLE001 - the sweeper thread must survive one bad sweep
                log.exception("sweep failed")
