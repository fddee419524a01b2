"""The turn transaction (docs/design.md §7): the only code that writes a session's snapshot.

A turn, in order:

1. **Authorise and read**: the session row of this tenant's agent (and, for an
   embed caller, of that end user). A lease still held answers 409 at once. A blocking
   turn on a session whose last turn committed in this process reads nothing: it runs
   on the row and canvas that turn kept, and where its version-checked claim or commit
   finds the session moved on, it runs again from a read (api/services/canvas_cache.py).
2. **Load** the snapshot into a :class:`~agent.canvas.Canvas`.
3. **Run without a lease** while the run only meets ``side_effect_free`` components
   (forms, Begin, Message, Switch, variable operations...), in the caller's thread.
4. **Claim**, only before the first component that is not (an LLM, a tool, HTTP,
   SQL...) or after :data:`UNLEASED_SECONDS`: a conditional ``UPDATE`` takes the
   lease (owner, expiry) only where the version is the one read and no live lease is
   held; it clears the cancel flag and records the turn's ``task_id``. Losing that
   race is a 409 too. The rest of a streamed turn runs in a worker thread that feeds
   a queue, which the HTTP response reads; ``message`` chunks go out as they come,
   the events that end the turn are held back. A client that goes away does not stop
   the worker. A process-wide :class:`~api.services.leases.LeaseKeeper` renews the
   lease while the turn runs and polls the cancel flag, which ``canvas.cancel_check``
   reads.
5. **Commit** in one transaction: the new snapshot with ``version + 1`` only where
   the version is the one read and the lease owner still matches (a turn that never
   took the lease: where no live lease is held, else it answers 409 and saves
   nothing), the turn's messages appended to the log, its keyed memory
   (``canvas.memory_writes``, see :mod:`api.services.memory`) appended, the lease
   released. Only then are the held events released to the client. A turn made only
   of side-effect-free components is thus a read and one write transaction.

A first message (no session id) makes its session in the turn's first transaction:
the claim writes the session's rows and takes the lease together, or, for a turn that
needs no lease, the commit writes them before the turn's own. A first message is thus
one transaction, as any other turn, not two: over HTTP it cost 1.25-1.34x a turn on
an existing session, now 1.11-1.24x (bench/routes.py). A turn refused before that
leaves nothing behind; one whose commit fails writes the session alone, so that the
session its reply names is there for the turn to be sent again.

A failed or cancelled turn leaves the snapshot as it was (the runtime restores it),
records its error on the session and appends nothing to the message log or memory. A worker
that dies mid-turn leaves its lease to expire (``LEASE_SECONDS``); the next turn then
proceeds from the last committed snapshot.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from flask import current_app
from peewee import SQL, Case, IntegrityError, PeeweeException

from agent import jsonio
from agent.canvas import Canvas, KeptCanvas
from agent.component import ComponentBase
from agent.errors import InputError, SnapshotTooLarge, UsageError
from api import telemetry
from api.config import canvas_limits
from api.db import Agent, MessageLog, Session, SessionSnapshot, db, now_ms, update_mark, write_transaction
from api.db.cluster import write_conflict
from api.db.database import WriteMissed, run_retrying, writer_in_line
from api.db.prepared import Prepared, inserting, new_row
from api.errors import ArgumentError, Busy, NotFound, TranscriptFull, is_outage
from api.services import history, memories
from api.services import variables as variables_service
from api.services.agents import get_agent, runnable_version_id, version_dsl
from api.services.canvas_cache import CanvasCache
from api.services.files import FileSettings, TurnFiles, files_of_turn, record_session_files
from api.services.leases import LeaseKeeper, lease_free, lease_live, new_owner
from api.services.mcp_servers import TenantServers
from api.services.memory import DatabaseMemoryStore
from api.services.retrieval import Retriever

log = logging.getLogger("agentcanvas.turns")

#: Events that end a turn; the client gets them only after the commit.
ENDING_EVENTS = frozenset({"message_end", "user_inputs", "workflow_finished"})
SOURCES = ("api", "embed", "openai", "cli", "webhook")
MAX_ERROR_CHARS = 4000
#: How long a turn whose commit failed waits for the database to tell its outcome.
OUTCOME_WAIT_SECONDS = 10.0
#: How long a turn runs side-effect-free components before it takes the lease anyway
#: (so that a long run can be cancelled and shows as running).
UNLEASED_SECONDS = 0.5
#: The services of a turn that keep no state between calls: shared by the turns of an agent.
_STATELESS_SERVICES = ("memory_store", "retriever", "mcp_servers")
#: The most agents whose stateless services are kept (then they are made anew).
_SHARED_SERVICES_ENTRIES = 1024
#: The most agent versions whose new sessions' first state is kept (then made anew).
_FIRST_STATES_ENTRIES = 256


def turn_service() -> TurnService:
    """The app's turn service (made by ``create_app``)."""
    return current_app._get_current_object().extensions["agentcanvas.turns"]  # type: ignore[attr-defined]


@dataclass
class TurnRequest:
    """One completion call.

    Attributes:
        tenant_id: the caller's tenant (authorisation).
        agent_id: the agent the session must belong to.
        session_id: an existing session, or ``None`` to start a new one.
        query, inputs, files, user_id: passed to ``Canvas.run``.
        invoke_from: ``api``, ``embed``, ``openai`` or ``cli`` (``sys.invoke_from``
            and the ``source`` of a new session).
        end_user: for embed callers, the end user the session is bound to: a session
            made by another user, or through another route, is "not found".
        services: extra objects for the canvas, over the app's ``SERVICES``.
        session_name: the name of a new session.
        webhook: the request that triggers a webhook run (Begin's outputs).
        release: which version a new session runs (see
            :func:`api.services.agents.runnable_version`): False the draft, True the
            latest release, None the latest release when there is one. An existing
            session always runs the version it started on.
        trace: whether a streamed turn's events include the nodes' ``node_started`` and
            ``node_finished`` (false: a caller that shows none of them, as a completion
            without ``return_trace``, has them not made). A blocking turn's never do.
    """

    tenant_id: str
    agent_id: str
    session_id: str | None = None
    query: str = ""
    inputs: dict | None = None
    files: list | None = None
    user_id: str = ""
    invoke_from: str = "api"
    end_user: str | None = None
    services: dict | None = None
    webhook: dict | None = None
    session_name: str = ""
    release: bool | None = False
    trace: bool = True


@dataclass
class TurnResult:
    """How a turn ended.

    Attributes:
        status: ``succeeded``, ``paused``, ``failed`` or ``cancelled``.
        final_event: the event that ends the turn for the client: ``message_end``,
            ``user_inputs``, or ``workflow_finished`` of a failed/cancelled turn.
        answer: the whole answer text streamed in this turn.
        error, error_type: for failed and cancelled turns.
    """

    status: str
    final_event: dict
    answer: str = ""
    error: str | None = None
    error_type: str | None = None


_DONE = object()


@dataclass(eq=False, slots=True)
class Turn:
    """A running turn. Read :meth:`events` (streaming) or call :meth:`wait` (blocking)."""

    session_id: str
    task_id: str
    created: bool = False
    result: TurnResult | None = None
    #: False for an inline (blocking) turn: only its ending events are kept for
    #: :meth:`events`, the ``message`` chunks are not kept (``wait()`` drops them).
    keep_events: bool = True
    # The events of a turn that ran (so far) in the caller's thread; a worker thread
    # that runs the rest hands its events over through ``_queue``.
    _kept: list = field(default_factory=list)
    _queue: queue.SimpleQueue | None = None
    _thread: threading.Thread | None = None

    def _put(self, event: dict) -> None:
        if self._queue is not None:
            self._queue.put(event)
        else:
            self._kept.append(event)

    def events(self) -> Iterator[dict]:
        """Every event of the turn, in order; the ending ones only after the commit.

        The events can be read once; after the end, this yields nothing."""
        kept, self._kept = self._kept, []
        yield from kept
        if self._queue is None:
            return
        while True:
            item = self._queue.get()
            if item is _DONE:
                self._queue.put(_DONE)  # leave the end for any later reader (wait())
                return
            yield item

    def wait(self) -> TurnResult:
        """The turn's result, once committed; the events not read are dropped.

        Joins the worker rather than reading the queue, so a blocking call is woken
        once, not once per event (each wake-up is a GIL hand-over with the worker).
        """
        if self._thread is not None:
            self._thread.join()
        elif self.result is None:
            for _ in self.events():
                pass
        assert self.result is not None
        return self.result

    def join(self, timeout: float | None = None) -> None:
        """Wait for the worker (commit included) without reading the events."""
        if self._thread is not None:
            self._thread.join(timeout)


@dataclass(slots=True)
class _Claim:
    """What a claimed turn needs to commit (made once a turn: built from positional
    arguments, which cost half what keywords do)."""

    session_id: str
    task_id: str
    #: The lease's owner once the turn took it; ``None`` while it runs without one.
    owner: str | None
    version: int
    round: int
    prior_status: str
    usage_before: dict
    #: The slot its state goes to (api.services.history): the next one, or for a
    #: regenerate the current one (over the state it takes back).
    slot: int
    #: The row's ``update_mark`` as read (the version the turn checks is the one read).
    update_mark: int
    # Whether it took back the last turn (a regenerate: it ran from the kept state
    # after ``round`` turns).
    rewound: bool = False
    #: A session made by the turn's first message, until the claim or the commit has
    #: written it (in the same transaction).
    new: _NewSession | None = None
    #: The row the turn runs on, whose committed successor the canvas cache keeps with
    #: the canvas (None: not kept, a regenerate's or an end user's new session's).
    row: _SessionRow | None = None
    #: Whether the turn runs on a kept row, not on one it read (:class:`_Stale`).
    unread: bool = False

    def session_written(self) -> None:
        """The rows of :attr:`new` (if any) are committed: by the claim, by the commit, or
        (a dropped connection) found there by the read-back."""
        if self.new is not None:
            self.new.written, self.new = True, None


class _Run:
    """A turn's run: its events still to come, and what it produced so far."""

    __slots__ = ("events", "held", "parts")

    def __init__(self, events: Iterator[dict]):
        self.events = events
        self.held: list[dict] = []  # the ending events, released after the commit
        self.parts: list[str] = []  # the answer's chunks


class TurnService:
    """Runs turns and owns every write of a session's state. One per app.

    Args:
        config: the app's config (``LEASE_SECONDS``, ``CANCEL_POLL_SECONDS``,
            ``LIMITS``, ``SERVICES``).
    """

    def __init__(self, config: dict[str, Any]):
        self.lease_ms = int(float(config["LEASE_SECONDS"]) * 1000)
        self.limits = canvas_limits(config)
        self.file_settings = FileSettings.from_config(config)
        self.max_transcript_bytes = int(config["MAX_TRANSCRIPT_BYTES"])
        self.keep_snapshots = int(config["KEEP_SNAPSHOTS"])
        # Extracts what RAGFlow Memories keep beyond raw messages, after the turn.
        self.extractor = memories.Extractor((config.get("SETTINGS") or {}).get("llm") or {})
        # The runtime reads its LLM and Invoke settings from these services when given
        # (else it reads conf/ itself, once per canvas): hand it the app's, already
        # layered with the environment and the app's config.
        settings = config.get("SETTINGS") or {}
        self.services: dict[str, Any] = {
            name: settings[section]
            for name, section in (("llm_settings", "llm"), ("invoke", "invoke"), ("tools", "tools"))
            if isinstance(settings.get(section), dict)
        }
        self.services.update(config.get("SERVICES") or {})
        self.keeper = LeaseKeeper(Session, self.lease_ms, float(config["CANCEL_POLL_SECONDS"]))
        # The canvases this process's last turns committed (api/services/canvas_cache.py).
        self.canvases = CanvasCache(config["CANVAS_CACHE_ENTRIES"], config["CANVAS_CACHE_BYTES"])
        self._active: set[Turn] = set()
        # (tenant id, agent id) -> the app's services and the turn's stateless ones (_turn_services).
        self._shared_services: dict[tuple[str, str], dict[str, Any]] = {}
        # agent version id -> the state and prologue its new sessions start with (_first_state).
        self._first_states: dict[str, tuple[str, str]] = {}
        self._active_lock = threading.Lock()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until this process runs no turn (all committed); false on timeout.

        For a graceful shutdown, and for tests that let a client go away mid-turn.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._active_lock:
                running = list(self._active)
            if not running:
                return True
            for turn in running:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                turn.join(left)
            if deadline is not None and time.monotonic() >= deadline:
                with self._active_lock:
                    return not self._active

    # ------------------------------------------------------------------ sessions
    def create_session(
        self,
        tenant_id: str,
        agent_id: str,
        name: str = "",
        user_id: str = "",
        source: str = "api",
        release: bool | None = False,
    ) -> tuple[Session, str]:
        """A new session holding a copy of one version of the agent's DSL; ``(row, prologue)``.

        ``release`` picks the version (:func:`api.services.agents.runnable_version`).
        """
        new = self._new_session(tenant_id, agent_id, name, user_id, source, release)
        with write_transaction():
            _insert_session(new)
        return Session(**new.values), new.prologue

    def _new_session(
        self, tenant_id: str, agent_id: str, name: str, user_id: str, source: str, release: bool | None
    ) -> _NewSession:
        """A new session's rows, not written yet (:func:`_insert_session` writes them)."""
        if source not in SOURCES:
            raise ArgumentError(f"session source {source!r} is not one of {', '.join(SOURCES)}")
        version_id = runnable_version_id(tenant_id, agent_id, release)
        snapshot, prologue = self._first_state(version_id)
        now = now_ms()
        values = new_row(
            Session,
            tenant_id=tenant_id,
            agent_id=agent_id,
            agent_version_id=version_id,
            name=name,
            user_id=user_id,
            source=source,
            state_slot=0,
            transcript_bytes=len(prologue.encode("utf-8")),
            create_time=now,
            update_time=now,
            update_mark=update_mark(now),
            expiry_mark=now,
        )
        return _NewSession(values, prologue, snapshot)

    def _first_state(self, version_id: str) -> tuple[str, str]:
        """``(snapshot, prologue)``: the state a new session of agent version ``version_id``
        starts in, and its Begin's prologue. Made once per version in this process: a
        version's DSL never changes and a new canvas's state depends on nothing else; the
        DSL is read and loaded, the canvas reset and dumped only the first time (each time
        it was most of a new session's cost, with the agent's whole row read as a model)."""
        first = self._first_states.get(version_id)
        if first is None:
            canvas = Canvas(version_dsl(version_id), limits=self.limits)
            canvas.reset()
            prologue = canvas.component("begin").prologue()
            first = (str(canvas), prologue)
            if len(self._first_states) >= _FIRST_STATES_ENTRIES:
                self._first_states.clear()
            self._first_states[version_id] = first
        return first

    def find_session(
        self,
        tenant_id: str,
        agent_id: str,
        session_id: str,
        end_user: str | None = None,
        fields: tuple = (),
    ) -> Session:
        """The session, if it is this tenant's and this agent's (and this end user's).

        ``fields`` limits the columns read (all of the row's by default); with
        :data:`api.services.history.STATE` among them, the session's state too (``snapshot``).
        """
        if not isinstance(session_id, str) or not session_id:
            raise ArgumentError(f"'session_id' must be a session id, got {session_id!r}")
        if not fields:
            prepared = _FIND_EMBED_SESSION if end_user is not None else _FIND_SESSION
            row = prepared.first(Session, id=session_id, agent=agent_id, tenant=tenant_id, user=end_user)
        else:
            cond = (
                (Session.id == session_id) & (Session.agent_id == agent_id) & (Session.tenant_id == tenant_id)
            )
            if end_user is not None:
                cond &= (Session.user_id == end_user) & (Session.source == "embed")
            row = history.select_with_state(*fields).where(cond).first()
        if row is None:
            raise NotFound(f"session {session_id!r} of agent {agent_id!r} not found")
        return row

    def _read_session(self, req: TurnRequest) -> _SessionRow:
        """What a turn reads of its session, as plain values (no model object is built)."""
        if not isinstance(req.session_id, str) or not req.session_id:
            raise ArgumentError(f"'session_id' must be a session id, got {req.session_id!r}")
        prepared = _READ_EMBED_SESSION if req.end_user is not None else _READ_SESSION
        row = prepared.row(id=req.session_id, agent=req.agent_id, tenant=req.tenant_id, user=req.end_user)
        if row is None:
            raise NotFound(f"session {req.session_id!r} of agent {req.agent_id!r} not found")
        return _SessionRow(*row)

    def _read_session_or_kept(self, req: TurnRequest) -> tuple[_SessionRow, KeptCanvas | None]:
        """The session as :meth:`_read_session` reads it, and the canvas this process kept
        of its current version, if any (then the snapshot is not read: ``row.snapshot``
        is the kept canvas's text)."""
        cached = self.canvases.version_of(req.session_id) if isinstance(req.session_id, str) else None
        if cached is None:
            row = self._read_session(req)
            if self.canvases.enabled:
                telemetry.metrics().canvas_cache.adder("miss")(1)
            return row, None
        prepared = _READ_EMBED_SESSION_IF_MOVED if req.end_user is not None else _READ_SESSION_IF_MOVED
        found = prepared.row(
            id=req.session_id, agent=req.agent_id, tenant=req.tenant_id, user=req.end_user, cached=cached
        )
        if found is None:
            raise NotFound(f"session {req.session_id!r} of agent {req.agent_id!r} not found")
        kept = self.canvases.take(found[0], found[2])  # id, version
        telemetry.metrics().canvas_cache.adder("miss" if kept is None else "hit")(1)
        if kept is not None:  # the row with the kept canvas's text as its snapshot
            return _SessionRow(found[0], kept.text, *found[2:]), kept
        if found[1] is None:  # the snapshot: another turn of the session took the entry meanwhile
            return self._read_session(req), None
        return _SessionRow(*found), None

    # ------------------------------------------------------------------ turns
    def start(self, req: TurnRequest, inline: bool = False) -> Turn:
        """Authorise and start a turn; its events arrive through the returned :class:`Turn`.

        With ``inline`` the turn runs to its commit in the calling thread and comes
        back finished: the choice for a blocking reply, which waits for the end
        anyway (the request thread finishes the turn whatever the client does), and
        saves a worker thread and a hand-over per event.

        Raises (with nothing changed):
            NotFound: no such agent or session for this caller.
            Busy: another turn holds the session.
            agent.errors.InputError / UsageError: the inputs do not fit the pending form.
        """
        if req.session_id is None:
            # The new session is written by the turn's first transaction: its claim, or,
            # for a turn that needs no lease, its commit (one transaction, not two).
            new = self._new_session(
                req.tenant_id,
                req.agent_id,
                req.session_name,
                req.user_id or (req.end_user or ""),
                req.invoke_from,
                req.release,
            )
            values = new.values
            row = _SessionRow._make(
                new.snapshot if f == "snapshot" else values[f] for f in _SessionRow._fields
            )
            try:
                return self._start(req, row, created=True, inline=inline, new=new)
            except BaseException:
                # A turn refused before it ran leaves nothing behind, not even its new session.
                if new.written:
                    _delete_session(row.id)
                raise
        if inline and self.canvases.enabled and isinstance(req.session_id, str):
            committed = self.canvases.take_committed(req.session_id, _reader(req))
            if committed is not None:
                row, kept = committed
                try:
                    turn = self._start(req, row, created=False, inline=True, kept=kept, unread=True)
                except _Stale as stale:
                    if not stale.refused:  # another process wrote the session: a miss after all
                        self.canvases.stale()
                        telemetry.metrics().canvas_cache.adder("stale")(1)
                else:
                    telemetry.metrics().canvas_cache.adder("hit")(1)
                    return turn
        row, kept = self._read_session_or_kept(req)
        return self._start(req, row, created=False, inline=inline, kept=kept)

    def regenerate(self, req: TurnRequest, inline: bool = False) -> Turn:
        """Run the session's last turn again from the state before it (docs/design.md §15).

        A turn like any other (lease, version, one transaction): the query, form answers
        and files are the last turn's, read from the message log; the last turn's
        messages stay in the log marked ``abandoned``. ``req.query``/``inputs``/``files``
        are ignored.

        Raises (with nothing changed): NotFound, Busy, and Conflict when no earlier state
        is kept (``session.keep_snapshots``) or there is no turn to regenerate.
        """
        row = self._read_session(req)
        if lease_live(row):
            raise _busy(row.id)
        _, base = history.kept_state(row.id, row.round - 1)
        asked = history.last_request(row.id, row.round)
        req = dataclasses.replace(req, query=asked["query"], inputs=asked["inputs"], files=asked["files"])
        return self._start(req, row, created=False, inline=inline, base=base)

    def undo(self, req: TurnRequest) -> Turn:
        """Restore the state the session had before its last turn; returns the finished turn.

        Its ending event is a ``message_end`` whose ``content`` is the last answer of
        the active branch now (``form`` too when that answer asks for a form).

        Raises (with nothing changed): NotFound, Busy, Conflict (nothing kept to restore).
        """
        row = self._read_session(req)
        if lease_live(row):
            raise _busy(row.id)
        base_round = row.round - 1
        slot, snapshot = history.kept_state(row.id, base_round)
        canvas = Canvas(snapshot, limits=self.limits)
        task_id, _ = turn_id(row.id)
        pending = canvas.pending_form()
        # Nothing runs: one conditional write, where the version is the one read and no
        # turn holds the session (else: busy, nothing changed), that points the session
        # at the state it restores.
        now = now_ms()
        with write_transaction():
            saved = _SAVE_TURN_UNLEASED.execute(
                now=now,
                id=row.id,
                version=row.version,
                task_id=task_id,
                slot=slot,
                status="paused" if pending is not None else "idle",
                pending_form=pending.id if pending is not None else None,
                round=base_round,
                bytes=0,
                **dict.fromkeys(_USAGE_KEYS, 0),
            )
            if saved != 1:
                raise _busy(row.id)
            _move_update_mark(row.id, row.update_mark, now)
            history.take_back_after(row.id, base_round, slot)
        self.canvases.drop(row.id)  # a canvas kept of the version before (none is kept of this one)
        event = _undo_event(row.id, task_id)
        turn = Turn(session_id=row.id, task_id=task_id)
        turn.result = TurnResult(status="succeeded", final_event=event, answer=event["data"]["content"])
        turn._put(event)
        return turn

    def _start(
        self,
        req: TurnRequest,
        row: _SessionRow,
        created: bool,
        inline: bool = False,
        base: str | bytes | None = None,
        kept: KeptCanvas | None = None,
        new: _NewSession | None = None,
        unread: bool = False,
    ) -> Turn:
        """Run the turn on ``row`` (claimed when it needs the lease, see the module docstring);
        ``base`` (a regenerate) is the kept state it runs from; ``kept``, the canvas this
        process kept of the row's version (api/services/canvas_cache.py); ``new``, the
        rows of a session not written yet, that the turn's first transaction writes;
        ``unread``, ``row`` is the one this process committed last, not read (raises
        :class:`_Stale` where the session moved on since)."""
        session_id = row.id
        if lease_live(row):
            raise _busy(session_id)
        try:
            self._check_transcript_room(row)
        except TranscriptFull:
            if unread:  # perhaps not on the row as it is: asked again on it
                raise _Stale(session_id, refused=True) from None
            raise
        # A regenerate reads keyed memory without what the turn it takes back wrote.
        services = self._turn_services(req, None if base is None else (row.id, row.round - 1))
        canvas = None
        if kept is not None and base is None:
            try:
                canvas = kept.load(limits=self.limits, services=services)
            except Exception:  # noqa: BLE001 - the snapshot it was kept as is at hand: loaded below
                log.exception("could not load the kept canvas of session %s", session_id)
        if canvas is None:
            snapshot = history.unpack(row.snapshot) if base is None else base
            canvas = Canvas(snapshot, limits=self.limits, services=services)
        pending = canvas.pending_form()
        # One id per turn: its task id (unless it resumes a paused form, whose turn it
        # continues), its message id and, its random half, its lease owner.
        turn_hex, message_id = turn_id(session_id)
        task_id = canvas.turn["task_id"] if pending is not None and canvas.turn else turn_hex
        # run() checks the inputs and files and only then returns the (lazy) run: bad
        # input is refused before the claim, so it leaves the row exactly as it was.
        try:
            events = canvas.run(
                query=req.query,
                user_id=req.user_id or req.end_user or row.user_id,
                inputs=req.inputs,
                files=req.files,
                conversation_id=session_id,
                agent_id=req.agent_id,
                invoke_from=req.invoke_from,
                webhook=req.webhook,
                task_id=task_id,
                message_id=message_id,
                trace=req.trace and not inline,  # a blocking reply is its ending event alone
            )
        except (InputError, UsageError):
            if unread:  # refused by the form pending in the version this process kept
                raise _Stale(session_id, refused=True) from None
            raise
        # A resumed turn carries the usage of its paused part, already counted.
        usage = (canvas.turn.get("usage") or {}) if pending is not None and canvas.turn else {}
        # session_id, task_id, owner (none yet), version, round, prior_status, usage_before,
        # slot, update_mark, rewound (a regenerate)
        claim = _Claim(
            session_id,
            task_id,
            None,
            row.version,
            row.round if base is None else row.round - 1,
            "paused" if row.pending_form else "idle",
            dict(usage),
            row.state_slot if base is not None else history.next_slot(row.state_slot, self.keep_snapshots),
            row.update_mark,
            base is not None,
            new,
            row if base is None and (not created or req.end_user is None) else None,
            unread,
        )
        # session_id, task_id, created, result, keep_events
        turn = Turn(session_id, task_id, created, None, not inline)
        run = _Run(events)
        watch = telemetry.TurnObserver(session_id, task_id, req.agent_id)
        with self._active_lock:
            self._active.add(turn)
        try:
            with watch:  # this thread made it; the worker below enters watch.active()
                effect = self._run_unleased(turn, canvas, run)
                if effect is not None:
                    self._take_lease(claim, turn_hex[16:], task_id, canvas, watch)
                    run.events = itertools.chain([effect], run.events)
                    if not inline:
                        turn._queue = queue.SimpleQueue()
                        turn._thread = threading.Thread(
                            target=self._run_in_worker,
                            args=(turn, canvas, run, claim, req, watch),
                            name=f"agentcanvas-turn-{session_id[:8]}",
                            # Not a daemon: a server process that shuts down (gunicorn's
                            # graceful exit) lets its running turns commit before it ends.
                            daemon=False,
                        )
                        turn._thread.start()
                        return turn
                    self._run_leased(turn, canvas, run, claim)
                self._finish(turn, canvas, run, claim, req)
        except BaseException:
            # Refused (busy, or the database is out of reach) before anything was saved.
            self._end(turn, watch, None)
            raise
        self._end(turn, watch, _outcome(turn.result))
        return turn

    def _turn_services(self, req: TurnRequest, taken_back: tuple[str, int] | None) -> dict[str, Any]:
        """The services of a turn's canvas: the app's, the request's, and over them the
        turn's own (keyed memory, files, retrieval and MCP servers of its tenant and agent).

        The turn's own services that keep no state (:data:`_STATELESS_SERVICES`) are made
        once per (tenant, agent) and shared by its turns (a regenerate's memory store, which
        leaves out what the turn it takes back wrote, is its own); the file service
        remembers the rows it read, so each turn gets one.
        """
        key = (req.tenant_id, req.agent_id)
        base = self._shared_services.get(key) if taken_back is None else None
        if base is None:
            base = {
                **self.services,
                "memory_store": _memory_store(req, taken_back),
                "retriever": Retriever(req.tenant_id, self.services.get("llm_settings")),
                "mcp_servers": TenantServers(req.tenant_id),
            }
            if taken_back is None:
                if len(self._shared_services) >= _SHARED_SERVICES_ENTRIES:
                    self._shared_services.clear()
                self._shared_services[key] = base
        services = base.copy()
        if req.services:
            services.update(req.services)
            for name in _STATELESS_SERVICES:  # the turn's own win over the request's
                services[name] = base[name]
        services["files"] = TurnFiles(req.tenant_id, req.agent_id, req.end_user, self.file_settings)
        return services

    def _check_transcript_room(self, row: Session | _SessionRow) -> None:
        """Refuse a turn on a session whose stored transcript is full (nothing changes).

        Checked before the turn runs, so a turn that started is saved whole: the log
        can pass the cap by at most one turn.
        """
        if row.transcript_bytes >= self.max_transcript_bytes:
            raise TranscriptFull(
                f"session {row.id!r} is full: its transcript holds {row.transcript_bytes} bytes and the "
                f"limit is {self.max_transcript_bytes} (session.max_transcript_bytes); start a new session "
                f"to go on"
            )

    def _take_lease(
        self, claim: _Claim, unique: str, task_id: str, canvas: Canvas, watch: telemetry.TurnObserver
    ) -> None:
        """Claim the session for the rest of the turn (raises Busy when another turn
        holds it or wrote it since it was read); the keeper renews it and polls the
        cancel flag, which the canvas reads from now on."""
        owner = new_owner(unique)
        now = now_ms()
        values = {
            "owner": owner,
            "expires": now + self.lease_ms,
            "task_id": task_id,
            "id": claim.session_id,
            "version": claim.version,
            "now": now,
        }
        try:
            if claim.new is None:
                with writer_in_line():
                    claimed = _CLAIM.execute(values)
            else:  # the session the first message makes, written with the claim
                with write_transaction():
                    _insert_session(claim.new)
                    claimed = _CLAIM.execute(values)
                claim.session_written()
        except PeeweeException as exc:
            if write_conflict(exc):
                raise _busy(claim.session_id) from None  # lost the race (rolled back): nothing to give back
            # The UPDATE may have been applied before the connection dropped: give the
            # lease back as soon as the database answers, or the session stays busy.
            orphan = dataclasses.replace(claim, owner=owner)
            self.keeper.release_later(owner, lambda: self._release(orphan))
            raise
        if claimed != 1:
            raise _Stale(claim.session_id) if claim.unread else _busy(claim.session_id)
        claim.owner = owner
        watch.lease_taken()
        canvas.cancel_check = self.keeper.track(owner).is_set

    def _release(self, claim: _Claim) -> None:
        """Give the lease back without writing anything (the turn never started)."""
        if claim.owner is None:
            return
        Session.update(lease_owner=None, lease_expires=0, status=claim.prior_status).where(
            (Session.id == claim.session_id) & (Session.lease_owner == claim.owner)
        ).execute()

    def _end(self, turn: Turn, watch: telemetry.TurnObserver, outcome: str | None) -> None:
        if turn._queue is not None:
            turn._queue.put(_DONE)
        with self._active_lock:
            self._active.discard(turn)
        watch.finish(outcome)

    def _take_event(self, turn: Turn, run: _Run, event: dict) -> None:
        if event["event"] in ENDING_EVENTS:
            run.held.append(event)
            return
        if event["event"] == "message":
            run.parts.append(str(event["data"].get("content") or ""))
        if turn.keep_events:
            turn._put(event)

    def _run_unleased(self, turn: Turn, canvas: Canvas, run: _Run) -> dict | None:
        """Run the canvas up to the first component that needs the lease: one that is not
        ``side_effect_free``, or any once the run has gone on for :data:`UNLEASED_SECONDS`.

        Returns that component's ``node_started`` event (the component has not run yet),
        or ``None`` when the run ended without one.
        """
        give_up = time.monotonic() + UNLEASED_SECONDS

        def needs_lease(cpn: ComponentBase | None) -> bool:
            return cpn is None or not cpn.side_effect_free or time.monotonic() > give_up

        # A run without trace (a blocking turn) announces only the components that need
        # the lease; after this, none (the lease is held, or the run is over).
        canvas.stop_before = needs_lease
        try:
            for event in run.events:
                if event["event"] == "node_started" and needs_lease(
                    canvas.components.get(event["data"].get("component_id"))
                ):
                    return event
                self._take_event(turn, run, event)
        except Exception as exc:  # noqa: BLE001 - run() should not raise; reported as a failed turn
            log.exception("canvas run raised")
            run.held = [
                _failure_event(canvas, f"internal error: {type(exc).__name__}: {exc}", "InternalError")
            ]
        finally:
            canvas.stop_before = None
        return None

    def _run_leased(self, turn: Turn, canvas: Canvas, run: _Run, claim: _Claim) -> None:
        """Run the rest of the canvas under the lease."""
        try:
            for event in run.events:
                self._take_event(turn, run, event)
        except Exception as exc:  # noqa: BLE001 - run() should not raise; never lose the lease over it
            log.exception("canvas run raised")
            run.held = [
                _failure_event(canvas, f"internal error: {type(exc).__name__}: {exc}", "InternalError")
            ]
        finally:
            self.keeper.untrack(claim.owner)

    def _run_in_worker(
        self,
        turn: Turn,
        canvas: Canvas,
        run: _Run,
        claim: _Claim,
        req: TurnRequest,
        watch: telemetry.TurnObserver,
    ) -> None:
        """The worker thread of a streamed turn that took its lease: run, commit, end."""
        try:
            with watch.active():
                self._run_leased(turn, canvas, run, claim)
                self._finish(turn, canvas, run, claim, req)
        finally:
            self._end(turn, watch, _outcome(turn.result))

    def _finish(self, turn: Turn, canvas: Canvas, run: _Run, claim: _Claim, req: TurnRequest) -> None:
        """Commit the turn, then release its ending events.

        Raises Busy (nothing saved) when a turn without a lease finds that another
        turn took the session or wrote it since it was read.
        """
        held = run.held
        result = _result_of(held, "".join(run.parts))
        save = functools.partial(self._commit, canvas, claim, req, result)
        try:
            committed = run_retrying(save)  # again, whole, after a conflict (1213, 1047)
        except Busy:
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the client below
            if is_outage(exc):  # the connection dropped: the commit may have happened
                log.warning(
                    "saving the turn of session %s failed (%s); reading back its outcome",
                    claim.session_id,
                    exc,
                )
                committed = self._outcome_after_failed_commit(canvas, claim, result, save)
            else:
                # Raised inside the transaction, before it could commit (the lease was
                # gone, or something of the turn cannot be stored): nothing was saved.
                log.warning("turn of session %s was not saved: %s", claim.session_id, exc)
                message = f"the turn could not be saved ({exc}); the session is as it was before this turn"
                if write_conflict(exc):  # still conflicting after run_retrying's attempts
                    message = "the turn could not be saved (concurrent writes kept conflicting with it); send it again"
                # Not an outage (503): a value of the turn the database cannot hold is a 500.
                kind = (
                    "TurnNotSaved" if isinstance(exc, LeaseLost) or write_conflict(exc) else "TurnNotStorable"
                )
                held = [_failure_event(canvas, message, kind)]
                committed = _result_of(held, result.answer)
                self._try_release(claim)
        if committed is not result and committed.final_event not in held:
            held = [committed.final_event]
        if claim.new is not None:  # not saved: the session its reply names is kept all the same
            self._write_new_session(claim)
        turn.result = committed
        for event in held:
            turn._put(event)

    @staticmethod
    def _write_new_session(claim: _Claim) -> None:
        """Write the session a first message made, on its own, where its turn was not
        saved: the reply names the session, on which the client sends the turn again
        (as if :meth:`create_session` had made it before the turn)."""
        new, claim.new = claim.new, None
        try:
            with db.connection_context(), write_transaction():
                _insert_session(new)
            new.written = True
        except IntegrityError:  # the row is there: a commit whose outcome was unknown was applied
            new.written = True
        except PeeweeException as exc:  # the database is out of reach
            log.warning(
                "could not write session %s, made by a turn that was not saved: %s", claim.session_id, exc
            )

    def _try_release(self, claim: _Claim) -> None:
        """Give the lease back now, or as soon as the database answers again."""
        if claim.owner is None:
            return
        try:
            with db.connection_context():
                self._release(claim)
        except PeeweeException:
            log.warning(
                "could not release the lease of session %s yet; retrying in the background", claim.session_id
            )
            self.keeper.release_later(claim.owner, lambda: self._release(claim))

    def _outcome_after_failed_commit(
        self, canvas: Canvas, claim: _Claim, result: TurnResult, save: Callable[[], TurnResult]
    ) -> TurnResult:
        """What to answer when the commit raised: was the turn saved? (docs/design.md §11).

        The connection may have dropped after the database committed, so the session
        is read back — waiting up to :data:`OUTCOME_WAIT_SECONDS` for the database to
        answer (another host, when the URL names several). Not saved: the commit is
        run once more (``save``; it applies only where the version and this turn's
        lease still match, so it cannot apply twice), and only if that fails too is
        the client told "not saved" (the lease is released at once). Only if the
        database stays out of reach: "outcome unknown" with the ``message_id`` to look
        for (the lease is released in the background as soon as the database is back).
        """
        message_id = result.final_event.get("message_id") or (canvas.turn or {}).get("message_id", "")
        saved = self._read_back(claim, message_id, result.status in ("succeeded", "paused"))
        if saved:
            claim.session_written()  # a new session was written with the turn
            return result
        if saved is False:
            try:
                return run_retrying(save)
            except Exception as exc:  # noqa: BLE001 - answered "not saved" below
                log.warning("saving the turn of session %s again failed too: %s", claim.session_id, exc)
        if saved is None:
            if claim.owner is not None:
                self.keeper.release_later(claim.owner, lambda: self._release(claim))
            message = (
                f"the database connection was lost while this turn was being saved, and the database "
                f"could not be reached again to tell whether it was; before sending the turn again, look "
                f"for message_id {message_id!r} in the session's messages"
            )
            error_type = "TurnOutcomeUnknown"
        else:
            self._try_release(claim)
            if result.status not in ("succeeded", "paused"):
                return result  # it failed anyway; only its error was not recorded
            message = (
                "the database connection was lost while this turn was being saved; it was not saved "
                "and the session is as it was before this turn: send it again"
            )
            error_type = "TurnNotSaved"
        event = _failure_event(canvas, message, error_type)
        event["message_id"] = message_id
        return _result_of([event], result.answer)

    def _read_back(self, claim: _Claim, message_id: str, logged: bool) -> bool | None:
        """Whether the turn's commit was applied: ``True``, ``False``, or ``None`` if the
        database cannot be reached within :data:`OUTCOME_WAIT_SECONDS`.

        The commit bumps the version only where this turn's lease still held, and
        appends the turn's messages (round and ``message_id``) in the same transaction.
        """
        give_up = time.monotonic() + OUTCOME_WAIT_SECONDS
        while True:
            try:
                with db.connection_context():
                    row = Session.select(Session.version).where(Session.id == claim.session_id).first()
                    if row is None or row.version == claim.version:
                        return False
                    if not logged:
                        return True
                    return (
                        MessageLog.select(MessageLog.id)
                        .where(
                            (MessageLog.session_id == claim.session_id)
                            & (MessageLog.round == claim.round + 1)
                            & (MessageLog.message_id == message_id)
                        )
                        .exists()
                    )
            except PeeweeException as exc:
                if time.monotonic() >= give_up:
                    log.warning("the outcome of a turn of session %s is unknown: %s", claim.session_id, exc)
                    return None
                time.sleep(0.25)

    def _commit(self, canvas: Canvas, claim: _Claim, req: TurnRequest, result: TurnResult) -> TurnResult:
        """The one transaction at the end of a turn; returns the result as committed."""
        snapshot = None
        if result.status in ("succeeded", "paused"):
            try:
                snapshot = canvas.dump_utf8(keepable=self.canvases.enabled)
            except SnapshotTooLarge as exc:
                result = TurnResult(
                    status="failed",
                    final_event=_failure_event(canvas, str(exc), type(exc).__name__),
                    answer=result.answer,
                    error=str(exc),
                    error_type=type(exc).__name__,
                )
        now = now_ms()
        values: dict[str, Any] = {
            "now": now,
            "id": claim.session_id,
            "version": claim.version,
            **_usage_delta(canvas, result, claim.usage_before),
        }
        leased = claim.owner is not None
        if leased:
            values["owner"] = claim.owner
        else:
            values["task_id"] = claim.task_id
        exchange: dict[str, Any] | None = None  # the values of _APPEND_EXCHANGE
        used_files: list[str] = []
        if snapshot is not None:
            pending = canvas.pending_form()
            page_size = getattr(db.obj, "file_page_size", 0)  # SQLite's (history.fill_pages)
            values.update(
                snapshot=history.fill_pages(snapshot, page_size, self.limits.max_snapshot_bytes),
                status="paused" if pending is not None else "idle",
                pending_form=pending.id if pending is not None else None,
            )
            exchange, values["bytes"] = _log_rows(
                claim, req, result, now, canvas.accepted_inputs, canvas.accepted_files
            )
            used_files = files_of_turn(canvas.accepted_files, canvas.accepted_inputs)
            values["round"] = claim.round + 1
            values["slot"] = claim.slot
            save = _SAVE_TURN if leased else _SAVE_TURN_UNLEASED
        else:
            error = result.error or ""
            if len(error) > MAX_ERROR_CHARS:
                error = error[: MAX_ERROR_CHARS - 1] + "…"
            values.update(status=claim.prior_status, error=error)
            save = _SAVE_FAILED_TURN if leased else _SAVE_FAILED_TURN_UNLEASED
        # Everything the writes need is made before the transaction: on SQLite it holds
        # the database's one write lock, which every other turn waits for meanwhile.
        try:
            with write_transaction():
                # The UPDATE, the new state and the messages: one round trip for the three
                # on MySQL, with the COMMIT too on Postgres (Prepared.send). If the UPDATE
                # matched nothing (the version moved: the slot may be another turn's now),
                # the transaction fails (WriteMissed), the state and the messages with it.
                if claim.new is not None:  # the session the first message makes
                    _insert_session(claim.new, send=True)
                save.send(values, one_row=True)
                _move_update_mark(claim.session_id, claim.update_mark, now)
                if snapshot is not None:
                    history.WRITE_STATE.send(values)  # into the slot the UPDATE points the row at
                if exchange is not None and not claim.rewound:
                    _APPEND_EXCHANGE.send(exchange)
                if snapshot is not None:
                    if claim.rewound:
                        # Before this turn's messages are added: they are the new active branch.
                        history.take_back_after(claim.session_id, claim.round, claim.slot)
                if exchange is not None and claim.rewound:
                    _APPEND_EXCHANGE.execute(exchange)
                if used_files:
                    # The session keeps the files it used until it is swept (api.services.files).
                    record_session_files(claim.session_id, used_files)
                if snapshot is not None and canvas.memory_writes:
                    # Keyed memory is part of the turn: committed with it or not at all.
                    _memory_store(req).commit(canvas.memory_writes, claim.session_id, claim.round + 1)
                saved_exchange, saved = None, []
                if result.status == "succeeded" and canvas.memory_saves:
                    # RAGFlow's "save to memory" (a Message's memory_ids): the raw exchange now.
                    saved_exchange = {
                        "agent_id": req.agent_id,
                        "session_id": claim.session_id,
                        "user_id": req.user_id or req.end_user or "",
                        "user_input": req.query or "",
                        "agent_response": result.answer,
                    }
                    saved = memories.save_exchange(
                        req.tenant_id, canvas.memory_saves, saved_exchange, strict=False
                    )
        except WriteMissed:
            if not leased:  # another turn holds the session, or wrote it since it was read
                raise (_Stale(claim.session_id) if claim.unread else _busy(claim.session_id)) from None
            raise LeaseLost(
                f"session {claim.session_id!r} was taken over or deleted while the turn ran "
                f"(its lease of {self.lease_ms / 1000:g} s expired?)"
            ) from None
        claim.session_written()
        if saved:
            # What the Memories' LLMs extract comes after, outside the turn's latency.
            self.extractor.submit(req.tenant_id, saved, saved_exchange)
        if snapshot is not None and self.canvases.enabled:
            # Committed: the canvas is version + 1 of the session, for its next turn here
            # (handed over: the last thing this turn does with it).
            try:
                kept_canvas = canvas.keep(snapshot)
                if kept_canvas is not None:
                    self.canvases.put(
                        claim.session_id,
                        claim.version + 1,
                        kept_canvas,
                        _committed_row(claim, req, values, now, snapshot),
                    )
            except Exception:  # noqa: BLE001 - the turn is saved; only its next one reads the row
                log.exception("could not keep the canvas of session %s", claim.session_id)
        return result

    # ------------------------------------------------------------------ other writes
    def save_variable(
        self,
        tenant_id: str,
        agent_id: str,
        session_id: str,
        name: str,
        value: Any,
        end_user: str | None = None,
    ) -> dict:
        """Set conversation variable ``name``: a versioned write of the snapshot.

        Raises:
            NotFound: no such session or variable. ArgumentError: wrong type.
            Busy: a turn holds the session (or wrote it meanwhile).
        """
        get_agent(tenant_id, agent_id)
        row = self._read_session(TurnRequest(tenant_id, agent_id, session_id, end_user=end_user))
        if lease_live(row):
            raise _busy(session_id)
        canvas = Canvas(history.unpack(row.snapshot), limits=self.limits)
        decl = variables_service.declaration(canvas.dsl, name)
        value = variables_service.check_value(name, decl.get("type"), value)
        canvas.set_value(f"env.{name}", value)
        snapshot = str(canvas)
        now = now_ms()
        with write_transaction():
            saved = (
                Session.update(version=Session.version + 1, update_time=now, update_mark=update_mark(now))
                .where(
                    (Session.id == session_id) & (Session.version == row.version) & lease_free(Session, now)
                )
                .execute()
            )
            if saved != 1:
                raise _busy(session_id)
            # The same round: over the current state, in place (api.services.history).
            history.WRITE_STATE.execute(
                {
                    "id": session_id,
                    "slot": row.state_slot,
                    "round": row.round,
                    "snapshot": snapshot,
                    "now": now,
                }
            )
        self.canvases.drop(session_id)  # a canvas kept of the version before
        return {"name": name, "type": decl.get("type", ""), "value": value}

    def request_cancel(self, tenant_id: str, task_id: str) -> dict:
        """Raise the cancel flag of the running turn ``task_id`` (any process runs it).

        Returns ``{task_id, session_id, cancelled}``; ``cancelled`` is false when
        the task is no longer running (the flag is not left behind: it is only set
        on a live lease, and every claim clears it).
        """
        row = _session_of_task(tenant_id, task_id)
        if row is None:
            raise NotFound(f"task {task_id!r} not found")
        hit = (
            Session.update(cancel_requested=True)
            .where(
                (Session.id == row.id)
                & (Session.task_id == task_id)
                & Session.lease_owner.is_null(False)
                & (Session.lease_expires >= now_ms())
            )
            .execute()
        )
        return {"task_id": task_id, "session_id": row.id, "cancelled": hit == 1}


def _session_of_task(tenant_id: str, task_id: str) -> Session | None:
    """The tenant's session that records ``task_id``, found by the id of the session the
    task id begins with (:func:`turn_id`): ``session.task_id`` has no index."""
    head = task_id[:16]
    if _is_hex(head):
        named = list(
            Session.select(Session.id, Session.task_id).where(
                Session.id.between(head, head + "g") & (Session.tenant_id == tenant_id)
            )
        )
        if named:
            # The session the task id names decides (a task id it no longer records, an
            # earlier turn's, is not found): no need to look further.
            return next((row for row in named if row.task_id == task_id), None)
    # A task id made before migration 19 (a form paused then, resumed now), or no task
    # of the tenant's: looked for among the tenant's sessions (by agent, indexed), each
    # read (no index on task_id).
    of_tenant = Agent.select(Agent.id).where(Agent.tenant_id == tenant_id)
    return (
        Session.select(Session.id)
        .where(
            (Session.task_id == task_id) & (Session.tenant_id == tenant_id) & Session.agent_id.in_(of_tenant)
        )
        .first()
    )


def turn_id(session_id: str) -> tuple[str, str]:
    """A turn's id, a version-4 UUID as ``(hex, text with dashes)`` (its task id and its
    message id), whose first half is the first half of ``session_id`` (itself a UUID's
    hex) and whose second half is random (62 bits of ``os.urandom``).

    The task id so names its session: a cancel finds the session by its primary key
    (:meth:`TurnService.request_cancel`), so ``session.task_id``, which a turn sets
    every time, needs no index. That index cost a page of the SQLite WAL per turn that
    records a new task id (0.5 of the 7.9 pages per request of bench/wal.py's
    pause/resume turns; every request of a conversation without forms).
    """
    head = session_id[:16] if _is_hex(session_id[:16]) else os.urandom(8).hex()
    raw = bytearray(bytes.fromhex(head) + os.urandom(8))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    text = raw.hex()
    return text, f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


_HEX = frozenset("0123456789abcdef")


def _is_hex(text: str) -> bool:
    """Whether ``text`` is 16 lowercase hex digits."""
    return len(text) == 16 and _HEX.issuperset(text)


def _outcome(result: TurnResult | None) -> str:
    """The metrics' name for how a turn ended."""
    if result is None:
        return "failed"
    if result.error_type == "TurnNotSaved":
        return "not_saved"
    return result.status


def _memory_store(req: TurnRequest, taken_back: tuple[str, int] | None = None) -> DatabaseMemoryStore:
    """Keyed memory of the turn's (tenant, agent): never another agent's or tenant's."""
    return DatabaseMemoryStore(req.tenant_id, req.agent_id, taken_back)


class _NewSession:
    """The rows of a session not written yet: the session (``values``, every column), its
    first state (``snapshot``, slot 0) and its Begin's ``prologue`` (the log's first
    message, if any); ``written`` once a transaction that wrote them has committed."""

    __slots__ = ("prologue", "snapshot", "values", "written")

    def __init__(self, values: dict[str, Any], prologue: str, snapshot: str):
        self.values = values
        self.prologue = prologue
        self.snapshot = snapshot
        self.written = False


def _insert_session(new: _NewSession, send: bool = False) -> None:
    """Write ``new``'s rows in the open transaction (``send``: without waiting for the
    answers, as :meth:`api.db.prepared.Prepared.send`)."""
    values = new.values
    now = values["create_time"]
    write = Prepared.send if send else Prepared.execute
    write(_INSERT_SESSION, values)
    write(
        history.WRITE_STATE, {"id": values["id"], "slot": 0, "round": 0, "snapshot": new.snapshot, "now": now}
    )
    if new.prologue:
        message = new_row(
            MessageLog,
            session_id=values["id"],
            round=0,
            role="assistant",
            content=new.prologue,
            create_time=now,
        )
        write(_INSERT_MESSAGE, message)


def _delete_session(session_id: str) -> None:
    with write_transaction():
        MessageLog.delete().where(MessageLog.session_id == session_id).execute()
        SessionSnapshot.delete().where(SessionSnapshot.session_id == session_id).execute()
        Session.delete().where(Session.id == session_id).execute()


class _Stale(Busy):
    """A turn that ran on the row this process committed last, unread, found the session
    moved on at its claim or commit (nothing was saved), or was refused before it ran
    (``refused``: its answers, files or transcript, checked on that row, which may be
    behind): :meth:`TurnService.start` runs it again from a read. A Busy, so that one
    that got out would still be a 409."""

    def __init__(self, session_id: str, refused: bool = False):
        super().__init__(f"session {session_id!r} was written elsewhere since this process last did")
        self.refused = refused


def _reader(req: TurnRequest) -> tuple[str, str, str | None]:
    """Who reads a session row in a turn: what the read's ``WHERE`` names (tenant, agent,
    end user), under which a row kept unread is kept and taken (CanvasCache.take_committed)."""
    return req.tenant_id, req.agent_id, req.end_user


def _committed_row(
    claim: _Claim, req: TurnRequest, values: dict[str, Any], now: int, snapshot: str | bytes
) -> tuple | None:
    """``(reader, row)``: the session row as the turn's commit left it (a succeeded or
    paused turn's; ``snapshot``, the text its canvas is kept as) and who read it, for the
    next turn in this process to run on unread (CanvasCache.take_committed); ``None``
    where the turn's row is not to be kept."""
    row = claim.row
    if row is None:
        return None
    return _reader(req), row._replace(
        snapshot=snapshot,
        version=claim.version + 1,
        round=values["round"],
        pending_form=values["pending_form"],
        lease_owner=None,
        lease_expires=0,
        transcript_bytes=row.transcript_bytes + values["bytes"],
        state_slot=claim.slot,
        update_mark=update_mark(now),  # _move_update_mark's
    )


class LeaseLost(Exception):
    """The commit found the session no longer held by this turn."""


# The statements every turn runs, compiled once per database (api.db.prepared).
_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")
#: The usage a turn that called no model adds (only ever spread into a statement's values).
_NO_USAGE = dict.fromkeys(_USAGE_KEYS, 0)


class _SessionRow(NamedTuple):
    """The columns of a session a turn reads (what ``_start`` takes)."""

    id: str
    # Its current state (api.services.history: the row of its slot, joined): bytes, the
    # UTF-8 a turn wrote (or, kept by earlier versions, compressed: history.unpack).
    snapshot: str | bytes
    version: int
    round: int
    user_id: str
    pending_form: str | None
    lease_owner: str | None
    lease_expires: int
    transcript_bytes: int
    state_slot: int
    update_mark: int


def _find(embed: bool, columns: tuple[str, ...] = (), unless_version: str = "") -> Prepared:
    """The session by id, agent, tenant (and end user); ``snapshot`` among ``columns``:
    its current state, joined (one statement); ``unless_version``: the name of a value
    for which ``snapshot`` reads NULL where the row has that version."""

    def column(m, name):
        if name == "snapshot":
            if not unless_version:
                return history.STATE
            # Named: else MySQL names the column by its text, the version in it, and a
            # connection parses its description anew each time (api.db.database: Result).
            snapshot = Case(
                None, [(Session.version == m(unless_version), SQL("NULL"))], SessionSnapshot.packed
            )
            return snapshot.alias("snapshot")
        return getattr(Session, name)

    def build(m):
        cond = (Session.id == m("id")) & (Session.agent_id == m("agent")) & (Session.tenant_id == m("tenant"))
        if embed:
            cond &= (Session.user_id == m("user")) & (Session.source == "embed")
        query = Session.select(*(column(m, c) for c in columns))
        if "snapshot" in columns:
            query = history.join_state(query)
        return query.where(cond)

    return Prepared(build)


_FIND_SESSION = _find(embed=False)
_FIND_EMBED_SESSION = _find(embed=True)
_READ_SESSION = _find(embed=False, columns=_SessionRow._fields)
_READ_EMBED_SESSION = _find(embed=True, columns=_SessionRow._fields)
# The same, the snapshot left out (NULL) where the version is the one kept in this process.
_READ_SESSION_IF_MOVED = _find(embed=False, columns=_SessionRow._fields, unless_version="cached")
_READ_EMBED_SESSION_IF_MOVED = _find(embed=True, columns=_SessionRow._fields, unless_version="cached")


_CLAIM = Prepared(
    lambda m: Session.update(
        {
            Session.lease_owner: m("owner"),
            Session.lease_expires: m("expires"),
            Session.cancel_requested: False,
            Session.status: "running",
            Session.task_id: m("task_id"),
        }
    ).where((Session.id == m("id")) & (Session.version == m("version")) & lease_free(Session, m("now")))
)


def _save(succeeded: bool, leased: bool = True) -> Prepared:
    """The end-of-turn UPDATE: only where the version is the one the turn read and, for a
    turn that took the lease, it still holds it; for one that did not, no turn holds it
    (this write then records the turn's task id, as a claim does)."""

    def build(m):
        changes = {
            Session.version: Session.version + 1,
            Session.lease_owner: None,
            Session.lease_expires: 0,
            Session.update_time: m("now"),
            Session.status: m("status"),
            **{getattr(Session, k): getattr(Session, k) + m(k) for k in _USAGE_KEYS},
        }
        if succeeded:
            changes.update(
                {
                    Session.state_slot: m("slot"),  # where history.WRITE_STATE wrote the state
                    Session.pending_form: m("pending_form"),
                    Session.round: m("round"),
                    Session.last_error: None,
                    Session.transcript_bytes: Session.transcript_bytes + m("bytes"),
                }
            )
        else:
            changes[Session.last_error] = m("error")
        cond = (Session.id == m("id")) & (Session.version == m("version"))
        if leased:
            cond &= Session.lease_owner == m("owner")
        else:
            changes[Session.cancel_requested] = False
            changes[Session.task_id] = m("task_id")
            cond &= lease_free(Session, m("now"))
        return Session.update(changes).where(cond)

    return Prepared(build)


_MOVE_UPDATE_MARK = Prepared(
    lambda m: Session.update({Session.update_mark: m("mark")}).where(Session.id == m("id"))
)


def _move_update_mark(session_id: str, read: int, now: int) -> None:
    """In the transaction that sets the session's ``update_time`` to ``now``: its
    ``update_mark`` too, where the row's (``read``, as the turn read it: the version it
    writes is the one read) is another 10-minute step's. Its own statement, sent only
    then: one that set it to the same value would still write its index entry (SQLite:
    a page of the WAL), and these are most turns."""
    mark = update_mark(now)
    if mark != read:
        _MOVE_UPDATE_MARK.send({"id": session_id, "mark": mark})


_SAVE_TURN = _save(succeeded=True)
_SAVE_FAILED_TURN = _save(succeeded=False)
_SAVE_TURN_UNLEASED = _save(succeeded=True, leased=False)
_SAVE_FAILED_TURN_UNLEASED = _save(succeeded=False, leased=False)
# The columns of a message-log row; _log_rows names its values "<column><row number>".
_LOG_COLUMNS = ("session_id", "round", "role", "content", "message_id", "meta", "create_time")
_INSERT_SESSION = inserting(Session)
_INSERT_MESSAGE = inserting(MessageLog)
_APPEND_EXCHANGE = Prepared(
    lambda m: MessageLog.insert_many([{c: m(f"{c}{i}") for c in _LOG_COLUMNS} for i in range(2)])
)


def _busy(session_id: str) -> Busy:
    return Busy(f"session {session_id!r} is busy: another turn is running; retry when it has finished")


def _failure_event(canvas: Canvas, message: str, error_type: str) -> dict:
    turn = canvas.turn or {}
    return {
        "event": "workflow_finished",
        "message_id": turn.get("message_id", ""),
        "created_at": int(time.time()),
        "task_id": turn.get("task_id", ""),
        "session_id": canvas.globals.get("sys.conversation_id", ""),
        "data": {
            "status": "failed",
            "error": message,
            "content": message,
            "error_type": error_type,
            "outputs": {},
        },
    }


def _result_of(held: list[dict], answer: str) -> TurnResult:
    """Read how the turn ended from its ending events (the last of each kind counts)."""
    paused = finished = message_end = None
    for e in held:
        name = e["event"]
        if name == "user_inputs":
            paused = e
        elif name == "workflow_finished":
            finished = e
        elif name == "message_end":
            message_end = e
    if paused is not None:
        return TurnResult("paused", paused, answer)
    status = (finished or {}).get("data", {}).get("status", "failed")
    if status == "succeeded":
        return TurnResult("succeeded", message_end or finished, answer)
    if finished is None:
        finished = {
            "event": "workflow_finished",
            "data": {"status": "failed", "error": "the run ended without a result"},
        }
    data = finished.setdefault("data", {})
    error = str(data.get("error") or "the run failed")
    data.setdefault("content", error)
    return TurnResult(
        status="cancelled" if status == "cancelled" else "failed",
        final_event=finished,
        answer=answer,
        error=error,
        error_type=data.get("error_type") or ("Cancelled" if status == "cancelled" else None),
    )


def _usage_delta(canvas: Canvas, result: TurnResult, before: dict) -> dict:
    usage = result.final_event.get("data", {}).get("usage") if result.final_event else None
    if not usage and canvas.turn:
        usage = canvas.turn.get("usage")
    if not usage and not before:  # a turn that called no model (read only: spread into the values)
        return _NO_USAGE
    usage = usage or {}
    return {k: int(usage.get(k) or 0) - int(before.get(k) or 0) for k in _USAGE_KEYS}


def _undo_event(session_id: str, task_id: str) -> dict:
    """The ending event of an undo: the last answer of the active branch (and its form)."""
    last = (
        MessageLog.select(MessageLog.content, MessageLog.meta, MessageLog.message_id)
        .where(
            (MessageLog.session_id == session_id)
            & (MessageLog.role == "assistant")
            & (MessageLog.abandoned == False)  # noqa: E712 - peewee builds SQL from ==
        )
        .order_by(MessageLog.id.desc())
        .first()
    )
    data: dict[str, Any] = {"content": last.content if last else "", "undone": True}
    meta = json.loads(last.meta) if last is not None and last.meta else {}
    if meta.get("form"):
        data["form"] = {"component_id": meta.get("component_id"), "inputs": meta["form"]}
    return {
        "event": "message_end",
        "message_id": last.message_id if last else "",
        "created_at": int(time.time()),
        "task_id": task_id,
        "session_id": session_id,
        "data": data,
    }


def _utf8_bytes(text: str | None) -> int:
    """The length of ``text`` in UTF-8 (an ASCII text's is its length: nothing is encoded)."""
    if not text:
        return 0
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _log_rows(
    claim: _Claim, req: TurnRequest, result: TurnResult, now: int, accepted_inputs: dict, files: list
) -> tuple[dict[str, Any], int]:
    """The message-log rows of a completed or paused turn, the user's then the assistant's,
    as :data:`_APPEND_EXCHANGE` takes them (``<column><row number>``), and the bytes they
    count against ``session.max_transcript_bytes`` (their content and meta)."""
    message_id = result.final_event.get("message_id", "")
    round_no = claim.round + 1
    # The answers as the form accepted them (``"41"`` for an integer is logged as 41).
    # Files as descriptors (a client may send bare ids): the transcript shows their names.
    user_meta = {}
    if accepted_inputs:
        user_meta["inputs"] = accepted_inputs
    if files:
        user_meta["files"] = files
    assistant = result.answer
    assistant_meta = None
    if result.status == "paused":
        data = result.final_event.get("data", {})
        tips = str(data.get("tips") or "")
        assistant = "\n\n".join(t for t in (assistant, tips) if t)
        assistant_meta = {"form": data.get("inputs"), "component_id": data.get("component_id")}
    elif (reference := (result.final_event.get("data") or {}).get("reference")) is not None:
        # The cited chunks, as RAGFlow lists them with a message of the transcript.
        assistant_meta = {"reference": reference.get("chunks") or []}
    query = req.query or ""
    user_meta_text = jsonio.dumps(user_meta) if user_meta else None
    assistant_meta_text = jsonio.dumps(assistant_meta) if assistant_meta else None
    rows = {
        "session_id0": claim.session_id,
        "round0": round_no,
        "role0": "user",
        "content0": query,
        "message_id0": message_id,
        "meta0": user_meta_text,
        "create_time0": now,
        "session_id1": claim.session_id,
        "round1": round_no,
        "role1": "assistant",
        "content1": assistant,
        "message_id1": message_id,
        "meta1": assistant_meta_text,
        "create_time1": now,
    }
    stored = (
        _utf8_bytes(query)
        + _utf8_bytes(user_meta_text)
        + _utf8_bytes(assistant)
        + _utf8_bytes(assistant_meta_text)
    )
    return rows, stored


def blocking_event(result: TurnResult, session_id: str) -> dict:
    """The reply ``data`` of a blocking call: the ending event, its ``content`` the whole answer."""
    # Copies of the two levels written here; the result's own event stays as it was.
    event = {**result.final_event, "session_id": session_id}
    data = event["data"] = dict(event.get("data") or {})
    if result.status == "succeeded":
        data["content"] = result.answer
    elif result.status == "paused":
        data["content"] = "\n\n".join(t for t in (result.answer, str(data.get("tips") or "")) if t)
    return event


def effective_status(row: Session) -> str:
    """``running`` only while a live lease is held; a dead worker's session shows its last state."""
    if row.status == "running" and not lease_live(row):
        return "paused" if row.pending_form else "idle"
    return row.status
