"""A per-process cache of the canvases the last turns left, like Temporal's sticky cache.

A turn reads its session's snapshot (several KB of JSON), parses it and builds a
:class:`~agent.canvas.Canvas`; parsing is most of that. When the session's previous
turn ran in this worker process, that turn's canvas is still at hand: after a turn
commits version ``v + 1`` of a session, the turn service keeps the canvas here
(:meth:`agent.canvas.Canvas.keep`) under ``(session id, v + 1)``. The next turn on the
session reads the row's small columns and, where the version is still ``v + 1``, loads
the kept canvas instead of the snapshot (the database leaves the snapshot out of its
answer: ``CASE WHEN version = v + 1 THEN NULL ELSE snapshot``).

Correctness rests on the version: every write of a snapshot bumps it (a turn, a
variable save, undo, regenerate, in any process), so a canvas kept for another
version is never used. A turn *takes* its session's entry out of the cache, so two
turns of one session never share a canvas; the entry is put back only by a turn that
committed, as the canvas it committed. A turn that fails, is cancelled, is refused or
is not saved leaves nothing behind.

A blocking turn reads nothing at all (:meth:`CanvasCache.take_committed`): the turn that
kept the canvas keeps with it the session row as it committed it (its version, round,
state slot, pending form...) and who read it (tenant, agent, end user). The next turn
runs on them unread, and its commit's conditional ``UPDATE`` checks the version, as any
turn's does. If another process wrote the session meanwhile (a turn, a variable, an
undo, a delete), that matches nothing and is rolled back, and the turn runs again from
a read. The first run is not seen: a blocking turn sends only its ending event, after
its commit, and what ran before was only side-effect-free components (the lease claim
that comes before any other is a version-checked write too, and where it fails the turn
runs again the same way). A streamed turn sends its events as they come, so it reads
first. Without the read, a request of the intake form's pause+resume turns over HTTP
cost 0.92x the floor's on MariaDB instead of 1.16x (one client; 0.94x instead of 1.09x
with 16) and 1.10x instead of 1.23x on Postgres (1.17x instead of 1.33x), a round trip
less; on SQLite it was the same within the noise (1.26x against 1.27x), the read being
a small part of its request (bench/http.py, each checkout's own, run one after the other).

It helps only when a session's consecutive turns reach the same worker process: a
keep-alive connection to one gunicorn worker, or a single worker. Otherwise each turn
misses and costs what it did without the cache (the read is the same one statement).
Bounded by entries and by the snapshot text they hold (``server.canvas_cache_entries``,
``server.canvas_cache_bytes``; 0 entries turns it off).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from agent.canvas import KeptCanvas


class CanvasCache:
    """Least recently used entries ``{session id: (version, kept canvas, its text's length,
    the committed row or None)}``, thread-safe.

    Args:
        max_entries: the most sessions kept (0: the cache is off).
        max_bytes: the most snapshot text the entries hold together (the UTF-8 bytes a
            turn wrote, or the characters of a text).
    """

    def __init__(self, max_entries: int, max_bytes: int):
        self.max_entries = max(0, int(max_entries))
        self.max_bytes = max(0, int(max_bytes))
        #: Whether the cache keeps anything (read on every turn: an attribute, not a property).
        self.enabled = self.max_entries > 0 and self.max_bytes > 0
        # Plain tuples, not a NamedTuple: one is made on every turn's put.
        self._entries: OrderedDict[str, tuple[int, KeptCanvas, int, tuple | None]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        #: Counts for the bench and the tests: takes that found the version asked
        #: for, takes that did not (nothing kept, or another version), puts.
        self.hits = 0
        self.misses = 0
        self.puts = 0

    def __len__(self) -> int:
        return len(self._entries)

    def version_of(self, session_id: str) -> int | None:
        """The version kept for the session, if any (the entry stays)."""
        entry = self._entries.get(session_id)
        return entry[0] if entry is not None else None

    def take(self, session_id: str, version: int) -> KeptCanvas | None:
        """The canvas kept as ``version`` of the session, removed from the cache; an
        entry of another version is dropped (it can never be used)."""
        with self._lock:
            entry = self._entries.pop(session_id, None)
            if entry is None:
                self.misses += 1
                return None
            self._bytes -= entry[2]
            if entry[0] != version:
                self.misses += 1
                return None
            self.hits += 1
            return entry[1]

    def take_committed(self, session_id: str, reader: tuple) -> tuple[Any, KeptCanvas] | None:
        """The session's kept canvas and the row its turn committed with it (see :meth:`put`),
        removed from the cache, where that turn's ``reader`` (who read the row: tenant,
        agent, end user) is this one; ``None`` otherwise (an entry without a row, or
        kept for another reader, stays for :meth:`take`)."""
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is None or entry[3] is None or entry[3][0] != reader:
                return None
            del self._entries[session_id]
            self._bytes -= entry[2]
            self.hits += 1
            return entry[3][1], entry[1]

    def stale(self) -> None:
        """A canvas :meth:`take_committed` handed out was not the session's current state
        (another process wrote it): counted as a miss, not a hit."""
        with self._lock:
            self.hits -= 1
            self.misses += 1

    def drop(self, session_id: str) -> None:
        """Forget the session's entry."""
        with self._lock:
            entry = self._entries.pop(session_id, None)
            if entry is not None:
                self._bytes -= entry[2]

    def put(self, session_id: str, version: int, kept: KeptCanvas, committed: tuple | None = None) -> None:
        """Keep ``kept`` as ``version`` of the session (unless a later version is kept);
        the least recently used entries go to make room. ``committed``: ``(reader, row)``,
        the session row as the turn that kept ``kept`` committed it and who read it, for
        :meth:`take_committed`."""
        size = len(kept.text)
        if not self.enabled or size > self.max_bytes:
            return
        entries = self._entries
        with self._lock:
            old = entries.get(session_id)
            if old is not None:
                if old[0] > version:  # a later turn of this process got here first
                    entries.move_to_end(session_id)
                    return
                del entries[session_id]
                self._bytes -= old[2]
            while entries and (len(entries) >= self.max_entries or self._bytes + size > self.max_bytes):
                self._bytes -= entries.popitem(last=False)[1][2]
            entries[session_id] = (version, kept, size, committed)
            self._bytes += size
            self.puts += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
