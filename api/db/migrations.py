"""Schema set-up: an ordered list of migrations, recorded in ``schema_version``.

:func:`setup_schema` runs at every start (``create_app``, the CLI) and applies the
migrations not yet recorded, in order. Each migration must be idempotent (create
only what is missing): two processes starting together on an empty database may both
run it, and the loser of that race retries once the winner's work is visible.

To change the schema, append ``(next number, "what", function)`` to
:data:`MIGRATIONS`; never edit or reorder one that has shipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from peewee import (
    BigIntegerField,
    BooleanField,
    CharField,
    Database,
    Field,
    IntegerField,
    IntegrityError,
    OperationalError,
    TextField,
)
from playhouse.migrate import SchemaMigrator
from playhouse.migrate import migrate as run_schema_changes

from api.db import fulltext
from api.db.database import db, is_postgres, is_sqlite
from api.db.models import (
    UPDATE_MARK_MS,
    Agent,
    AgentVersion,
    ApiToken,
    Chunk,
    Dataset,
    Document,
    DocumentPiece,
    FilePiece,
    McpServer,
    Memory,
    MemoryEntry,
    MessageLog,
    RateLimitCounter,
    SchemaVersion,
    Session,
    SessionFile,
    SessionSnapshot,
    SessionTrash,
    Tenant,
    UploadFile,
    WebhookLog,
    WorkerLease,
)

log = logging.getLogger("agentcanvas.db")

Migration = Callable[[Database], None]


def _create_tables(database: Database) -> None:
    # create_table(safe=True) skips a table that exists (and, on MySQL, its indexes).
    for model in (Tenant, ApiToken, Agent, AgentVersion, Session, MessageLog):
        model.create_table(safe=True)


def _add_columns(database: Database, table: str, columns: dict[str, Field]) -> None:
    """Add the ``columns`` that ``table`` lacks (a database made by migration 1 from
    today's models has them already)."""
    present = {c.name for c in database.get_columns(table)}
    migrator = SchemaMigrator.from_database(database)
    changes = [migrator.add_column(table, name, f) for name, f in columns.items() if name not in present]
    if changes:
        run_schema_changes(*changes)


def _add_agent_embed_origins(database: Database) -> None:
    _add_columns(database, Agent._meta.table_name, {"embed_origins": TextField(null=True)})


def _add_transcript_columns(database: Database) -> None:
    _add_columns(database, Session._meta.table_name, {"transcript_bytes": BigIntegerField(default=0)})
    _add_columns(database, MessageLog._meta.table_name, {"abandoned": BooleanField(default=False)})


def _add_index(database: Database, model: type, columns: tuple[str, ...]) -> None:
    table = model._meta.table_name
    if any(tuple(i.columns) == columns for i in database.get_indexes(table)):
        return
    run_schema_changes(SchemaMigrator.from_database(database).add_index(table, columns, False))


def _add_history_and_retention(database: Database) -> None:
    for model in (SessionSnapshot, SessionTrash, WorkerLease):
        model.create_table(safe=True)
    _add_columns(database, Agent._meta.table_name, {"session_ttl_seconds": BigIntegerField(null=True)})
    _add_columns(
        database,
        MemoryEntry._meta.table_name,
        {"session_id": CharField(max_length=32, null=True), "round": IntegerField(null=True)},
    )
    _add_index(database, Session, ("update_time",))
    _add_index(database, MemoryEntry, ("session_id", "round"))
    _add_index(database, MemoryEntry, ("create_time",))


def _pack_kept_states(database: Database) -> None:
    # Kept states are compressed now (session_state.packed); the few kept as text by
    # migration 7 only served undo and are let go.
    SessionSnapshot.create_table(safe=True)
    database.execute_sql("DROP TABLE IF EXISTS session_snapshot")


def _add_memories(database: Database) -> None:
    Memory.create_table(safe=True)
    _add_columns(
        database,
        MemoryEntry._meta.table_name,
        {
            "memory_id": CharField(max_length=32, null=True),
            "status": BooleanField(default=True),
            "source_id": BigIntegerField(default=0),
        },
    )
    _add_index(database, MemoryEntry, ("memory_id", "id"))


def _create_memory_entry(database: Database) -> None:
    MemoryEntry.create_table(safe=True)


def _create_knowledge_bases(database: Database) -> None:
    for model in (Dataset, Document, DocumentPiece, Chunk):
        model.create_table(safe=True)
    fulltext.create_schema(database)


def _move_document_pieces(database: Database) -> None:
    if "document_piece" not in database.get_tables():
        return
    database.execute_sql(
        "INSERT INTO file_piece (file_id, part, seq, data) SELECT document_id, 'data', seq, data FROM document_piece"
    )
    database.execute_sql("DROP TABLE document_piece")


def _create_upload_files(database: Database) -> None:
    UploadFile.create_table(safe=True)
    FilePiece.create_table(safe=True)


def _add_rate_limits(database: Database) -> None:
    RateLimitCounter.create_table(safe=True)
    _add_columns(database, Agent._meta.table_name, {"rate_limits": TextField(null=True)})


def _create_mcp_servers(database: Database) -> None:
    McpServer.create_table(safe=True)


def _create_webhook_logs(database: Database) -> None:
    WebhookLog.create_table(safe=True)


def _add_releases(database: Database) -> None:
    _add_columns(database, AgentVersion._meta.table_name, {"release": BooleanField(default=False)})
    _add_columns(
        database, Agent._meta.table_name, {"release_version_id": CharField(max_length=32, null=True)}
    )


def _add_session_files(database: Database) -> None:
    SessionFile.create_table(safe=True)
    # Uploads made before: which sessions read them is not known, so the sweep leaves them.
    _add_columns(database, UploadFile._meta.table_name, {"sweepable": BooleanField(default=False)})


def _keep_states_in_slots(database: Database) -> None:
    # kept_state replaces session_state: a session's K kept states in slots round % K,
    # each turn writing over the oldest. The states kept so far move over, at most one a
    # slot (K is the server's setting, unknown here: the default, 10; the newest state of
    # a slot wins, and with another K the next turns write over them as they come).
    SessionSnapshot.create_table(safe=True)
    if "session_state" not in database.get_tables():
        return
    # Another process setting up the same database may have moved them already.
    insert, tail, mod = "INSERT IGNORE INTO", "", "%%"  # the drivers' format paramstyle: %% is %
    if is_sqlite(database):
        insert, mod = "INSERT OR IGNORE INTO", "%"
    elif is_postgres(database):
        insert, tail = "INSERT INTO", " ON CONFLICT DO NOTHING"
    database.execute_sql(
        f"{insert} kept_state (session_id, slot, round, packed, create_time)"
        f" SELECT s.session_id, s.round {mod} 10, s.round, s.packed, s.create_time FROM session_state s"
        " WHERE NOT EXISTS (SELECT 1 FROM session_state t WHERE t.session_id = s.session_id"
        f" AND t.round {mod} 10 = s.round {mod} 10 AND (t.round > s.round OR (t.round = s.round AND t.id > s.id)))"
        f"{tail}"
    )
    database.execute_sql("DROP TABLE IF EXISTS session_state")


def _states_in_the_ring(database: Database) -> None:
    # A session's state moves from its row (session.snapshot) into the ring of its kept
    # states (api.services.history), which session.state_slot points into: a turn then
    # writes its snapshot once. The state after round r goes to slot r % 10, the slot the
    # previous version's next turn would have kept it in (K is the server's setting,
    # unknown here: the default, 10), over the oldest kept state; the ring of K + 1 slots
    # goes on from there, writing over the oldest first, as before.
    _add_columns(database, Session._meta.table_name, {"state_slot": IntegerField(default=0)})
    if "snapshot" not in {c.name for c in database.get_columns(Session._meta.table_name)}:
        return  # made by today's models, or moved already by another process
    quote = "`" if not (is_sqlite(database) or is_postgres(database)) else '"'
    session, kept = f"{quote}session{quote}", f"{quote}kept_state{quote}"
    rnd = f"{quote}round{quote}"
    mod, snapshot = "%%", "snapshot"  # the drivers' format paramstyle: %% is %
    upsert = f" ON DUPLICATE KEY UPDATE {rnd} = VALUES({rnd}), packed = VALUES(packed), create_time = VALUES(create_time)"
    if is_sqlite(database) or is_postgres(database):
        upsert = (
            f" ON CONFLICT (session_id, slot) DO UPDATE SET {rnd} = EXCLUDED.{rnd},"
            " packed = EXCLUDED.packed, create_time = EXCLUDED.create_time"
        )
    if is_sqlite(database):
        mod = "%"
    elif is_postgres(database):
        # Text into bytea, as sent: undo api.db.pgtext's encoding (a snapshot, JSON, holds
        # no NUL: only the two noncharacters, each escaped as a pair beginning U+FFFE).
        snapshot = (
            "convert_to(replace(replace(snapshot, chr(65534) || chr(65535), chr(65535)),"
            " chr(65534) || chr(65534), chr(65534)), 'UTF8')"
        )
    with database.atomic():
        # Another process setting up the same database may move them at the same time:
        # both write the same rows.
        database.execute_sql(
            f"INSERT INTO {kept} (session_id, slot, {rnd}, packed, create_time)"
            f" SELECT id, {rnd} {mod} 10, {rnd}, {snapshot}, update_time FROM {session} WHERE 1 = 1{upsert}"
        )
        database.execute_sql(f"UPDATE {session} SET state_slot = {rnd} {mod} 10")
    migrator = SchemaMigrator.from_database(database)
    run_schema_changes(migrator.drop_column(Session._meta.table_name, "snapshot", cascade=False))


def _drop_index(database: Database, model: type, columns: tuple[str, ...]) -> None:
    table = model._meta.table_name
    migrator = SchemaMigrator.from_database(database)
    for index in database.get_indexes(table):
        if tuple(index.columns) == columns:
            run_schema_changes(migrator.drop_index(table, index.name))


def _expiry_mark(database: Database) -> None:
    # The sweep finds sessions that may have expired by session.expiry_mark, which turns
    # never write, instead of by an index on update_time, which every turn moved (on
    # SQLite a page of the WAL per committed request, 1 of 8.9: bench/wal.py --by-table).
    # A mark is at or before update_time: update_time itself will do.
    _add_columns(database, Session._meta.table_name, {"expiry_mark": BigIntegerField(default=0)})
    Session.update(expiry_mark=Session.update_time).where(Session.expiry_mark == 0).execute()
    _add_index(database, Session, ("expiry_mark",))
    _drop_index(database, Session, ("update_time",))


def _unindexed_task_id(database: Database) -> None:
    # A task id begins with its session's id, which finds it (api.services.turns.turn_id);
    # the index on session.task_id, moved by every turn with a new task id (on SQLite a
    # page of the WAL, 0.5 of 7.9 per request of bench/wal.py), goes.
    _drop_index(database, Session, ("task_id",))


def _update_mark(database: Database) -> None:
    # The sessions listing sorted by update_time (the default) read and sorted all of
    # an agent's sessions: 0.4-1 s a page at 100,000 of them on SQLite. update_mark, its
    # 10-minute step, indexed, orders them up to the step (api.services.sessions).
    _add_columns(database, Session._meta.table_name, {"update_mark": BigIntegerField(default=0)})
    quote = "`" if not (is_sqlite(database) or is_postgres(database)) else '"'
    mod = "%" if is_sqlite(database) else "%%"  # the drivers' format paramstyle: %% is %
    # Another process setting up the same database may do it at the same time: both
    # write the same values.
    database.execute_sql(
        f"UPDATE {quote}session{quote} SET update_mark = update_time - update_time {mod} {UPDATE_MARK_MS}"
        " WHERE update_mark = 0"
    )
    _add_index(database, Session, ("agent_id", "update_mark"))


#: (version, description, function), in the order they apply.
MIGRATIONS: list[tuple[int, str, Migration]] = [
    (1, "tenants, tokens, agents, versions, sessions, message log", _create_tables),
    (2, "agent.embed_origins: parent origins allowed to frame the embed page", _add_agent_embed_origins),
    (3, "memory_entry: keyed LLM memory that outlives a session", _create_memory_entry),
    (4, "datasets, documents, chunks and the full-text index", _create_knowledge_bases),
    (5, "session.transcript_bytes (transcript cap), message_log.abandoned", _add_transcript_columns),
    (6, "upload_file, file_piece: files in conversations", _create_upload_files),
    (
        7,
        "kept session snapshots, session trash, worker leases, agent.session_ttl_seconds, memory turns",
        _add_history_and_retention,
    ),
    (8, "documents keep their bytes as file pieces; document_piece dropped", _move_document_pieces),
    (9, "rate_limit_counter, agent.rate_limits: rate limits shared by the workers", _add_rate_limits),
    (10, "kept session states compressed (session_state replaces session_snapshot)", _pack_kept_states),
    (11, "memory (RAGFlow's Memory); memory_entry.memory_id, status, source_id", _add_memories),
    (12, "mcp_server: the MCP servers of a tenant", _create_mcp_servers),
    (13, "webhook_log: the runs of agents' webhooks", _create_webhook_logs),
    (14, "agent_version.release, agent.release_version_id: drafts and releases", _add_releases),
    (
        15,
        "session_file, upload_file.sweepable: a session's files removed with it by the sweep",
        _add_session_files,
    ),
    (
        16,
        "kept_state replaces session_state: a session's kept states in slots, written over",
        _keep_states_in_slots,
    ),
    (
        17,
        "session.state_slot: a session's state lives in the ring of its kept states (session.snapshot moved there)",
        _states_in_the_ring,
    ),
    (
        18,
        "session.expiry_mark, indexed, finds sessions that may have expired (update_time's index dropped)",
        _expiry_mark,
    ),
    (19, "session.task_id unindexed: a task id begins with its session's id", _unindexed_task_id),
    (20, "session.update_mark, indexed with agent_id: sessions listed by update_time", _update_mark),
]


def applied_versions() -> set[int]:
    return {row.version for row in SchemaVersion.select(SchemaVersion.version)}


def setup_schema(attempts: int = 5) -> int:
    """Apply the pending migrations; returns the schema version now in force."""
    for attempt in range(attempts):
        try:
            return _apply_pending()
        except (OperationalError, IntegrityError) as exc:
            # Another process is setting up the same database (duplicate index,
            # duplicate version row): wait for it and look again.
            if attempt + 1 == attempts:
                raise
            log.info("schema set-up raced with another process (%s); retrying", exc)
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _apply_pending() -> int:
    SchemaVersion.create_table(safe=True)
    done = applied_versions()
    for version, name, migrate in MIGRATIONS:
        if version in done:
            continue
        log.info("applying migration %d: %s", version, name)
        migrate(db.obj)
        SchemaVersion.insert(version=version, name=name).on_conflict_ignore().execute()
    return max(v for v, _, _ in MIGRATIONS)
