"""Storage: peewee models bound late to SQLite, MySQL or Postgres (see :mod:`api.db.database`)."""

from __future__ import annotations

from api.db.database import (
    bind_database,
    check_writable,
    db,
    ensure_server_database,
    is_sqlite,
    open_database,
    write_transaction,
)
from api.db.migrations import setup_schema
from api.db.models import (
    ALL_MODELS,
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
    date_of,
    new_id,
    now_ms,
    update_mark,
)


def init_database(url: str, max_connections: int = 32) -> None:
    """Open ``url``, bind the models to it and bring the schema up to date."""
    database = open_database(url, max_connections=max_connections)
    check_writable(database)
    ensure_server_database(database)
    bind_database(database)
    with db.connection_context():
        setup_schema()


__all__ = [
    "ALL_MODELS",
    "Agent",
    "AgentVersion",
    "ApiToken",
    "Chunk",
    "Dataset",
    "Document",
    "DocumentPiece",
    "FilePiece",
    "RateLimitCounter",
    "Memory",
    "McpServer",
    "MemoryEntry",
    "MessageLog",
    "SchemaVersion",
    "Session",
    "SessionFile",
    "SessionSnapshot",
    "SessionTrash",
    "Tenant",
    "UploadFile",
    "WebhookLog",
    "WorkerLease",
    "bind_database",
    "check_writable",
    "date_of",
    "db",
    "init_database",
    "is_sqlite",
    "new_id",
    "now_ms",
    "open_database",
    "setup_schema",
    "update_mark",
    "write_transaction",
]
