"""A session's states: the current one, and the earlier ones for regenerate and undo
(docs/design.md §15).

A session's state (its snapshot) lives in the ring of its states, the rows of
:class:`~api.db.SessionSnapshot`: the row with ``round=r`` is the state after ``r``
turns on the active branch. The session row names the slot that holds the current
state (``Session.state_slot``) and carries no snapshot, so a committed turn writes its
snapshot once. The ring has ``keep + 1`` slots (``session.keep_snapshots``, default 10;
0 keeps none, and then there is nothing to regenerate or undo): the current state and
the ``keep`` before it.

* A turn that advances the round writes its new state into the slot after the current
  one (:func:`next_slot`), over the oldest kept state (an upsert: a row is added only
  until the ring is full), and points the session row at it.
* A write that does not advance the round (a regenerated turn, a variable set over the
  REST API) writes the current slot over, in place.
* **Undo** restores the state after ``round - 1`` turns by pointing the session row at
  its slot: nothing is written but the session row.
* **Regenerate** runs the last turn again (its query, form answers and files, read
  from the message log) from that same state, and writes its result over the state it
  takes back.

Both take back the last turn: its messages stay in the log marked ``abandoned``; the
keyed memory it wrote is removed, and so is its state (an undo's; a regenerate writes
over it); the session's history and node memory are those of the restored snapshot. So
what the next turn sees follows the active branch only.

Every write of a state goes with the conditional ``UPDATE`` of the session row (where
its ``version`` is the one read) in one transaction, so the slot it names is the one
the row named, and a write that lost the race is rolled back with it. The slot is kept
on the row, never derived from the round: ``keep`` is a setting that may change between
runs. When it does, the ring goes on from the slot the row names: after it shrinks, the
rows in slots beyond it stay until their turn is taken back or the session is swept
(valid earlier states of the active branch, found by their round), and after it grows
the new slots are filled as the ring reaches them.

A state is kept as the snapshot's UTF-8 as the turn wrote it (the text on SQLite when
the standard library wrote it): neither compressed (zlib cost more CPU than the rest of
the commit) nor copied. Postgres compresses such values itself (TOAST). On SQLite a
state over a page is followed by spaces up to what its pages hold (:func:`fill_pages`),
so that the next state of its slot is written over it in place. Rows kept
zlib-compressed by earlier versions are still read (:func:`unpack`).
These functions run inside the turn service's transactions (:mod:`api.services.turns`),
which alone write a session's state.
"""

from __future__ import annotations

import json
import zlib

from peewee import Expression, ModelSelect, Node

from api.db import MemoryEntry, MessageLog, Session, SessionSnapshot, db
from api.db.database import is_postgres, is_sqlite
from api.db.prepared import Prepared, mark_utf8
from api.errors import Conflict

#: The current state as a column of a query of sessions joined with :func:`join_state`
#: (named ``snapshot``; read it through :func:`unpack`).
STATE = SessionSnapshot.packed.alias("snapshot")


def state_join() -> Expression:
    """The condition that joins a session with its current state (one row, by the
    unique key ``(session_id, slot)``)."""
    return (SessionSnapshot.session_id == Session.id) & (SessionSnapshot.slot == Session.state_slot)


def join_state(query: ModelSelect) -> ModelSelect:
    """``query`` (of sessions) joined with each session's current state (:data:`STATE`)."""
    return query.join(SessionSnapshot, on=state_join())


def select_with_state(*fields: Node) -> ModelSelect:
    """Sessions' ``fields``, joined with their current state when :data:`STATE` is one of
    them (then on the session's object as ``snapshot``)."""
    query = Session.select(*fields)
    if any(f is STATE for f in fields):
        query = join_state(query).objects()  # the state's column on the session's object
    return query


def next_slot(slot: int, keep: int) -> int:
    """The slot a turn that advances the round writes its state into: the one after the
    current ``slot`` in a ring of ``keep + 1``."""
    return (slot + 1) % (keep + 1)


def kept_state(session_id: str, round_no: int) -> tuple[int, str | bytes]:
    """The kept state after ``round_no`` turns: ``(its slot, the snapshot)``.

    Raises:
        Conflict: there is none (no turn to take back, or it is older than the kept ones).
    """
    if round_no < 0:
        raise Conflict(f"session {session_id!r} has no turn to take back yet")
    row = (
        SessionSnapshot.select(SessionSnapshot.slot, SessionSnapshot.packed)
        .where((SessionSnapshot.session_id == session_id) & (SessionSnapshot.round == round_no))
        .order_by(SessionSnapshot.id.desc())
        .first()
    )
    if row is None:
        raise Conflict(
            f"session {session_id!r} keeps no state from before its last turn: only the last "
            f"session.keep_snapshots turns can be regenerated or undone (0 keeps none)"
        )
    return row.slot, unpack(row.packed)


def unpack(packed: str | bytes | memoryview) -> str | bytes:
    """A state as a snapshot's text or its UTF-8 (what ``Canvas`` and ``json.loads`` take):
    as it was kept (the snapshot's UTF-8, or text on SQLite), or zlib-compressed, as
    earlier versions kept it."""
    if isinstance(packed, str):
        return packed
    if isinstance(packed, memoryview):
        packed = bytes(packed)
    if packed[:1] == b"{":  # a snapshot is a JSON object; zlib's first byte is never "{"
        return packed
    return zlib.decompress(packed)


#: The most a kept state's SQLite record holds besides the snapshot: its header (7-9
#: bytes), the session id (32), slot and round (0-4) and create time (6).
_RECORD_OVERHEAD = 52


def fill_pages(snapshot: bytes | str, page_size: int, limit: int) -> bytes | str:
    """``snapshot`` followed by spaces (JSON's whitespace: it parses the same) up to the
    most the SQLite pages it takes hold, where it takes more than one page and the
    spaces add at most a quarter of its size; else as it is, as a snapshot kept as text
    (its size in bytes is not at hand) or on another database (``page_size`` 0).

    A turn writes its state over the one its slot kept. SQLite writes a row over one of
    the same size in place: only those of its pages whose bytes changed. A row of
    another size is deleted and inserted again: its overflow pages go to the free list
    and come back from it, which writes page 1 and a free-list page too. Filled, a state
    has the size of the one it replaces as long as both take as many pages (each turn's
    state differs by a few bytes): 7.45 WAL pages a request became 5.71 in
    ``bench/wal.py --warmup 150``, and 12.58 became 6.71 with a 27 KB state (``--prompt-bytes
    20000``), most of whose pages, the DSL's, are the same from one turn to the next and
    are no longer written. Each page a commit writes is copied to the WAL and back, and under
    ``synchronous=FULL`` synced (~12 us a page here, on a sync of ~140 us).

    The spaces cost no page written: a row's overflow pages are written whole anyway,
    and so is its leaf page. On disk they take the rest of that leaf page, which the
    row would otherwise share with other rows: at most a quarter more than the state
    (on 4 KB pages, a state from 6.5 to 8.1 KB, 9.8 to 12.2 KB, 13 to 16.3 KB, and any
    state over 16.3 KB, is filled). A state that fits on its leaf page is
    left as it is, as one the spaces would take past ``limit`` (``max_snapshot_bytes``:
    it must load again).

    SQLite keeps up to ``page_size - 35`` bytes of a record on its table's leaf page and
    ``page_size - 4`` on each overflow page (with no bytes reserved per page, as SQLite
    makes a file unless an extension asks).
    """
    if not page_size or not isinstance(snapshot, bytes):
        return snapshot
    length = len(snapshot)
    size = length + _RECORD_OVERHEAD
    on_leaf, on_overflow = page_size - 35, page_size - 4
    if size <= on_leaf:
        return snapshot
    overflow_pages = -(-(size - on_leaf) // on_overflow)
    filled = length + on_leaf + overflow_pages * on_overflow - size
    if filled - length > length // 4 or filled > limit:
        return snapshot
    return snapshot.ljust(filled)


def last_request(session_id: str, round_no: int) -> dict:
    """What the user sent in turn ``round_no`` of the active branch: ``{query, inputs, files}``.

    Raises:
        Conflict: the message log has no such turn.
    """
    row = (
        MessageLog.select(MessageLog.content, MessageLog.meta)
        .where(
            (MessageLog.session_id == session_id)
            & (MessageLog.round == round_no)
            & (MessageLog.role == "user")
            & (MessageLog.abandoned == False)  # noqa: E712 - peewee builds SQL from ==
        )
        .order_by(MessageLog.id.desc())
        .first()
    )
    if row is None:
        raise Conflict(f"session {session_id!r} has no turn {round_no} to regenerate")
    meta = json.loads(row.meta) if row.meta else {}
    return {"query": row.content, "inputs": meta.get("inputs") or None, "files": meta.get("files") or None}


def _write_state(m):  # noqa: ANN001, ANN202 - a Prepared builder
    """The state of session ``id`` after ``round`` turns into ``slot``: over the state kept
    there, in place, or (a slot not filled yet) as a new row."""
    return SessionSnapshot.insert(
        {
            SessionSnapshot.session_id: m("id"),
            SessionSnapshot.slot: m("slot"),
            SessionSnapshot.round: m("round"),
            SessionSnapshot.packed: mark_utf8("snapshot"),
            SessionSnapshot.create_time: m("now"),
        }
    ).on_conflict(
        # MySQL names no target: its ON DUPLICATE KEY UPDATE takes any unique key (the one there is).
        conflict_target=[SessionSnapshot.session_id, SessionSnapshot.slot]
        if is_sqlite(db) or is_postgres(db)
        else None,
        preserve=[SessionSnapshot.round, SessionSnapshot.packed, SessionSnapshot.create_time],
    )


#: Writes a state: values ``id`` (the session), ``slot``, ``round``, ``snapshot`` (text or
#: its UTF-8) and ``now``. Only with the session row's conditional UPDATE, in its
#: transaction (see the module docstring). Every turn runs it: compiled once per database
#: (api.db.prepared).
WRITE_STATE = Prepared(_write_state)


def take_back_after(session_id: str, round_no: int, slot: int) -> None:
    """Abandon the turns after ``round_no``: mark their messages, remove their keyed memory
    and their states but the one in ``slot``, the session's state now (an undo's: the
    state after ``round_no`` turns; a regenerate's: the state it wrote over the one it
    took back)."""
    MessageLog.update(abandoned=True).where(
        (MessageLog.session_id == session_id)
        & (MessageLog.round > round_no)
        & (MessageLog.abandoned == False)  # noqa: E712
    ).execute()
    MemoryEntry.delete().where(
        (MemoryEntry.session_id == session_id) & (MemoryEntry.round > round_no)
    ).execute()
    SessionSnapshot.delete().where(
        (SessionSnapshot.session_id == session_id)
        & (SessionSnapshot.round > round_no)
        & (SessionSnapshot.slot != slot)
    ).execute()
