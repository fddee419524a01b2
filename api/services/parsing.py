"""Parsing documents in the background: tasks in the database, claimed with a lease.

A document whose ``run`` is ``RUNNING`` is a task. Any server process may claim it
with the lease of :mod:`api.services.leases` (the same mechanism turns use): a
conditional ``UPDATE`` sets ``lease_owner`` only where nobody holds a live lease, and
the process's :class:`~api.services.leases.LeaseKeeper` renews the lease while the
work goes on and watches ``cancel_requested``.

The work: read the stored bytes, parse them (:mod:`agent.docparse`), chunk them
(:mod:`agent.chunking`), embed the chunks when the dataset has an embedding model,
and store them in batches. Each batch is one transaction that first moves the
document's ``progress`` forward **only where this worker still holds the lease and
the document is still ``RUNNING``**; if that matches no row (cancelled, deleted,
taken over after the lease expired) the batch is rolled back and the work stops.
So a worker that was presumed dead never writes again, and a cancel is final the
moment it is committed.

Chunking is deterministic and each parsed chunk has its index (``(document_id,
chunk_index)`` is unique), so a task taken over from a killed worker carries on after
the chunks already stored and never stores one twice.

Each server process runs :class:`ParseWorkers`: ``datasets.parse_threads`` threads
(default 1) that take tasks one at a time, so a large upload never takes more than
that from the process's turns; a file over :data:`INLINE_PARSE_BYTES` is parsed in a
child process (one pool per process, as many as the threads), so that reading a big
PDF does not hold this process's interpreter while its turns run. Cancel
(``DELETE /datasets/<id>/chunks``) marks the
document ``CANCEL`` and removes its chunks in one transaction: from then on the
document is what the user sees, whichever process was working on it.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from peewee import PeeweeException, fn

from agent import docparse
from agent.chunking import DEFAULT_CHUNK_TOKENS, DEFAULT_DELIMITER, naive_chunks, token_count
from agent.errors import LLMError
from api.db import Chunk, Dataset, Document, db, new_id, now_ms, write_transaction
from api.db.database import insert_rows
from api.errors import ArgumentError
from api.services import datasets
from api.services.datasets import CHUNKS, KnowledgeLimits
from api.services.leases import LeaseKeeper, lease_free, lease_live, new_owner
from api.telemetry import metrics

log = logging.getLogger("agentcanvas.parsing")

#: Chunks stored per transaction (and between looks at the cancel flag).
BATCH = 64
#: Files up to this size are parsed in the worker thread; larger ones in a child process.
INLINE_PARSE_BYTES = 256 * 1024
_CHUNK_COLUMNS = (
    "id",
    "dataset_id",
    "document_id",
    "chunk_index",
    "content",
    "important_keywords",
    "questions",
    "available",
    "token_count",
    "embedding",
    "create_time",
    "update_time",
)
MAX_MESSAGE = 2000


class TaskStopped(Exception):
    """The task is no longer this worker's (cancelled, deleted, or taken over)."""


def start_parsing(tenant_id: str, dataset_id: str, document_ids: Any) -> list[str]:
    """Queue documents for parsing (``POST /datasets/<id>/chunks``).

    Earlier chunks made by a parse are removed; chunks added by hand stay.

    Raises:
        ArgumentError: no ids, or a document is being parsed now.
        NotFound: a document not in this tenant's dataset.
    """
    ds = datasets.get_dataset(tenant_id, dataset_id)
    if not document_ids:
        raise ArgumentError("'document_ids' is required: the documents to parse")
    ids = datasets._check_document_ids(ds, document_ids, "document_ids")
    now = now_ms()
    with write_transaction():
        docs = list(Document.select().where(Document.id.in_(ids)))
        busy = [d for d in docs if d.run == "RUNNING" and lease_live(d)]
        if busy:
            raise ArgumentError(
                f"document {busy[0].id!r} is being parsed now; cancel it first (DELETE /datasets/{ds.id}/chunks)"
            )
        datasets.delete_chunks_of(ids, parsed_only=True)
        Document.update(
            run="RUNNING",
            progress=0.0,
            progress_msg=f"{_clock()} Queued for parsing.",
            process_begin_at=now,
            process_duration=0.0,
            lease_owner=None,
            lease_expires=0,
            cancel_requested=False,
            update_time=now,
        ).where(Document.id.in_(ids)).execute()
        _recount(ids)
    return ids


def cancel_parsing(tenant_id: str, dataset_id: str, document_ids: Any) -> list[str]:
    """Stop parsing documents (``DELETE /datasets/<id>/chunks``): ``CANCEL``, their parsed chunks removed.

    Raises:
        ArgumentError: no ids, or a document is not being parsed.
    """
    ds = datasets.get_dataset(tenant_id, dataset_id)
    if not document_ids:
        raise ArgumentError("'document_ids' is required: the documents whose parsing to stop")
    ids = datasets._check_document_ids(ds, document_ids, "document_ids")
    now = now_ms()
    with write_transaction():
        idle = [
            d.id
            for d in Document.select(Document.id, Document.run).where(Document.id.in_(ids))
            if d.run != "RUNNING"
        ]
        if idle:
            raise ArgumentError(f"document {idle[0]!r} is not being parsed; nothing to cancel")
        datasets.delete_chunks_of(ids, parsed_only=True)
        Document.update(
            run="CANCEL",
            cancel_requested=True,
            progress_msg=Document.progress_msg.concat(f"\n{_clock()} Cancelled."),
            update_time=now,
        ).where(Document.id.in_(ids)).execute()
        _recount(ids)
    return ids


def _recount(ids: list[str]) -> None:
    """Set ``chunk_count``/``token_count`` of documents from their chunks."""
    counts = {
        r[0]: (int(r[1] or 0), int(r[2] or 0))
        for r in Chunk.select(Chunk.document_id, fn.COUNT(Chunk.id), fn.SUM(Chunk.token_count))
        .where(Chunk.document_id.in_(ids))
        .group_by(Chunk.document_id)
        .tuples()
    }
    for doc_id in ids:
        chunks, tokens = counts.get(doc_id, (0, 0))
        Document.update(chunk_count=chunks, token_count=tokens).where(Document.id == doc_id).execute()


def _clock() -> str:
    return time.strftime("%H:%M:%S")


class ParseWorkers:
    """The parse threads of one process (see the module docstring).

    Args:
        limits: the ``datasets`` settings (``parse_threads``, batch sizes, chunk cap).
        lease_seconds: how long a task's lease lasts without renewal.
        poll_seconds: how often idle threads look for tasks and the keeper for cancels.
        embed: ``(dataset, texts) -> vectors | None`` (:mod:`api.services.retrieval`).
    """

    def __init__(self, limits: KnowledgeLimits, lease_seconds: float, poll_seconds: float, embed):  # noqa: ANN001
        self.limits = limits
        self.lease_ms = int(lease_seconds * 1000)
        self.poll_seconds = poll_seconds
        self.embed = embed
        self.keeper = LeaseKeeper(Document, self.lease_ms, min(poll_seconds, 0.5))
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        """Start the threads (idempotent); none when ``parse_threads`` is 0."""
        with self._lock:
            if self._threads or self._stop.is_set():
                return
            for i in range(self.limits.parse_threads):
                thread = threading.Thread(target=self._loop, name=f"agentcanvas-parse-{i}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def wake(self) -> None:
        """A task was queued here: look now rather than at the next poll."""
        self.start()
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the threads after their current batch (the task stays queued for others,
        its lease given back) and then the lease keeper; whether all ended within
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        stopped = not any(thread.is_alive() for thread in self._threads)
        # Only once no task is worked on: a task's lease is renewed by the keeper.
        return stopped and self.keeper.stop(max(0.0, deadline - time.monotonic()))

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with db.connection_context():
                    claimed = self._claim_next()
                if claimed is None:
                    self._wake.wait(self.poll_seconds)
                    self._wake.clear()
                    continue
                self.run_task(*claimed)
                continue
            except PeeweeException as exc:
                log.warning("parse worker could not reach the database: %s", exc)
            except Exception:  # noqa: BLE001 - a worker thread must survive any one task
                log.exception("parse worker failed")
            # Paused outside the handler: the error's frames (and any cursor they hold
            # on a connection already back in the pool) are freed before the pause.
            self._stop.wait(1.0)

    def _claim_next(self) -> tuple[str, str] | None:
        """Claim the oldest free ``RUNNING`` document; ``(document id, owner)`` or ``None``."""
        now = now_ms()
        # Read whole before the first UPDATE: on SQLite a SELECT not read to its end
        # keeps its snapshot open, and an UPDATE on that connection then fails at once
        # with "database is locked" whenever another connection writes (it cannot wait
        # for the lock, as its snapshot may be out of date); the connection went back
        # to the pool with that snapshot still open, and every thread it went to next
        # read old rows (a running turn saw its lease as gone and was cancelled).
        candidates = [
            row.id
            for row in Document.select(Document.id)
            .where((Document.run == "RUNNING") & lease_free(Document, now))
            .order_by(Document.update_time, Document.id)
            .limit(8)
        ]
        for document_id in candidates:
            owner = new_owner()
            claimed = (
                Document.update(lease_owner=owner, lease_expires=now + self.lease_ms, cancel_requested=False)
                .where((Document.id == document_id) & (Document.run == "RUNNING") & lease_free(Document, now))
                .execute()
            )
            if claimed == 1:
                return document_id, owner
        return None

    # ------------------------------------------------------------------ one task
    def run_task(self, document_id: str, owner: str) -> None:
        """Parse one claimed document to the end, or until it is no longer ours."""
        stop = self.keeper.track(owner)
        try:
            with db.connection_context():
                self._work(document_id, owner, stop)
        except TaskStopped:
            log.info(
                "parse of document %s stopped: no longer this worker's, or the workers stop", document_id
            )
        except PeeweeException:
            log.exception("parse of document %s lost the database; its lease will expire", document_id)
        finally:
            self.keeper.untrack(owner)
            try:
                with db.connection_context():
                    Document.update(lease_owner=None, lease_expires=0).where(
                        (Document.id == document_id) & (Document.lease_owner == owner)
                    ).execute()
            except PeeweeException:
                pass  # it expires by itself

    def _work(self, document_id: str, owner: str, stop: threading.Event) -> None:
        doc = Document.get_or_none(Document.id == document_id)
        if doc is None:
            return
        ds = Dataset.get_or_none(Dataset.id == doc.dataset_id)
        if ds is None:
            return
        started = time.monotonic()
        config = datasets._json_field(doc.parser_config, {})
        try:
            parsed = self._parse(datasets.document_bytes(doc.id), doc.name, stop)
        except docparse.ParseError as exc:
            self._fail(doc, owner, f"cannot parse {doc.name!r}: {exc}")
            return
        self._check(stop)
        texts = naive_chunks(
            [s.text for s in parsed.sections],
            int(config.get("chunk_token_num") or DEFAULT_CHUNK_TOKENS),
            str(config.get("delimiter") or DEFAULT_DELIMITER),
        )
        if not texts:
            self._fail(doc, owner, f"{doc.name!r} holds no text to index")
            return
        done = Chunk.select().where((Chunk.document_id == doc.id) & Chunk.chunk_index.is_null(False)).count()
        others = Chunk.select().where((Chunk.dataset_id == ds.id) & (Chunk.document_id != doc.id)).count()
        own_manual = Chunk.select().where((Chunk.document_id == doc.id) & Chunk.chunk_index.is_null()).count()
        cap = self.limits.max_chunks_per_dataset
        if others + own_manual + len(texts) > cap:
            self._fail(
                doc,
                owner,
                f"{doc.name!r} makes {len(texts)} chunks; dataset {ds.id!r} may hold {cap} "
                f"and has {others + own_manual} (datasets.max_chunks_per_dataset)",
                drop_chunks=True,
            )
            return
        note = f"{_clock()} Parsed {len(parsed.sections)} section(s) into {len(texts)} chunk(s)."
        if done:
            note += f" Resuming after {done} stored chunk(s)."
        self._advance(doc.id, owner, done / len(texts), note)
        for start in range(done, len(texts), self.limits.embedding_batch if ds.embedding_model else BATCH):
            self._check(stop)
            size = self.limits.embedding_batch if ds.embedding_model else BATCH
            batch = texts[start : start + size]
            try:
                vectors = self.embed(ds, batch) if ds.embedding_model else None
            except LLMError as exc:
                self._fail(doc, owner, f"the chunks could not be embedded with {ds.embedding_model!r}: {exc}")
                return
            self._check(stop)
            self._store(doc, ds, owner, start, batch, vectors, (start + len(batch)) / len(texts))
        self._finish(doc.id, owner, time.monotonic() - started, len(texts))

    def _parse(self, data: bytes, name: str, stop: threading.Event) -> docparse.ParsedDocument:
        """Parse here when small; a larger file in a child process, so that this process's
        turns keep the interpreter while a big PDF is read (and a cancel need not wait)."""
        if len(data) <= INLINE_PARSE_BYTES:
            return docparse.parse(data, name)
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=max(1, self.limits.parse_threads),
                    mp_context=multiprocessing.get_context("spawn"),
                )
            pool = self._pool
        future = pool.submit(docparse.parse, data, name)
        while True:
            try:
                return future.result(timeout=0.2)
            except FutureTimeout:
                if stop.is_set() or self._stop.is_set():
                    future.cancel()
                    raise TaskStopped() from None
            except BrokenProcessPool:
                with self._lock:
                    self._pool = None
                raise docparse.ParseError("the parser process ended unexpectedly (out of memory?)") from None

    def _check(self, stop: threading.Event) -> None:
        """End the task here if its lease is gone or cancelled, or the workers stop."""
        if stop.is_set() or self._stop.is_set():
            raise TaskStopped()

    def _advance(self, document_id: str, owner: str, progress: float, note: str | None = None) -> None:
        """Move progress forward where the task is still ours; else :class:`TaskStopped`."""
        changes: dict[str, Any] = {"progress": min(progress, 0.99), "update_time": now_ms()}
        if note:
            changes["progress_msg"] = Document.progress_msg.concat("\n" + note)
        hit = (
            Document.update(changes)
            .where(
                (Document.id == document_id) & (Document.lease_owner == owner) & (Document.run == "RUNNING")
            )
            .execute()
        )
        if hit != 1:
            raise TaskStopped()

    def _store(
        self,
        doc: Document,
        ds: Dataset,
        owner: str,
        start: int,
        texts: list[str],
        vectors: list[list[float]] | None,
        progress: float,
    ) -> None:
        now = now_ms()
        rows = [
            (
                new_id(),
                ds.id,
                doc.id,
                start + i,
                text,
                "[]",
                "[]",
                True,
                token_count(text),
                datasets.pack_vector(vectors[i]) if vectors else None,
                now,
                now,
            )
            for i, text in enumerate(texts)
        ]
        with write_transaction():
            self._advance(doc.id, owner, progress)
            insert_rows("chunk", _CHUNK_COLUMNS, rows)
            CHUNKS.add(ds.id, [(r[0], r[4]) for r in rows])

    def _finish(self, document_id: str, owner: str, seconds: float, chunks: int) -> None:
        with write_transaction():
            hit = (
                Document.update(
                    run="DONE",
                    progress=1.0,
                    progress_msg=Document.progress_msg.concat(f"\n{_clock()} Done: {chunks} chunk(s)."),
                    process_duration=Document.process_duration + round(seconds, 3),
                    lease_owner=None,
                    lease_expires=0,
                    update_time=now_ms(),
                )
                .where(
                    (Document.id == document_id)
                    & (Document.lease_owner == owner)
                    & (Document.run == "RUNNING")
                )
                .execute()
            )
            if hit != 1:
                raise TaskStopped()
            _recount([document_id])
        metrics().parse_tasks.labels("done").inc()

    def _fail(self, doc: Document, owner: str, message: str, drop_chunks: bool = False) -> None:
        message = message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"
        with write_transaction():
            hit = (
                Document.update(
                    run="FAIL",
                    progress_msg=Document.progress_msg.concat(f"\n{_clock()} Failed: {message}"),
                    lease_owner=None,
                    lease_expires=0,
                    update_time=now_ms(),
                )
                .where(
                    (Document.id == doc.id) & (Document.lease_owner == owner) & (Document.run == "RUNNING")
                )
                .execute()
            )
            if hit == 1 and drop_chunks:
                datasets.delete_chunks_of([doc.id], parsed_only=True)
                _recount([doc.id])
        if hit == 1:
            metrics().parse_tasks.labels("failed").inc()


def parse_workers_for(app) -> ParseWorkers:  # noqa: ANN001 - a Flask app
    """The app's parse workers (made by ``create_app``)."""
    return app.extensions["agentcanvas.parsing"]
