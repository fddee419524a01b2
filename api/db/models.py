"""The tables.

Ids are 32-character hex strings. Times are epoch milliseconds (RAGFlow's
``create_time``/``update_time``). Rows refer to each other by id columns with
indexes but without database foreign keys: deletes cascade in the services, inside
one transaction, so the schema runs unchanged on MySQL-compatible distributed engines
(TiDB, Vitess) whose foreign-key support varies.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

from peewee import (
    BigAutoField,
    BigIntegerField,
    BlobField,
    BooleanField,
    CharField,
    CompositeKey,
    FloatField,
    IntegerField,
    Model,
    TextField,
)

from api.db.database import db


def new_id() -> str:
    return uuid.uuid4().hex


def now_ms() -> int:
    return int(time.time() * 1000)


def date_of(ms: int) -> str:
    """A time in ms as RAGFlow's replies write dates (``create_date``...): local time."""
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


#: The width of :attr:`Session.update_mark`'s steps: 10 minutes, in ms.
UPDATE_MARK_MS = 600_000


def update_mark(update_time: int) -> int:
    """:attr:`Session.update_mark` for ``update_time``: the start of its 10-minute step."""
    return update_time - update_time % UPDATE_MARK_MS


class LongTextField(TextField):
    """``LONGTEXT`` on MySQL (``TEXT`` holds only 64 KiB); plain text on SQLite."""

    field_type = "LONGTEXT"


class LongBlobField(BlobField):
    """``LONGBLOB`` on MySQL (``BLOB`` holds only 64 KiB); a plain blob on SQLite."""

    field_type = "LONGBLOB"


class BaseModel(Model):
    class Meta:
        database = db
        legacy_table_names = False

    @classmethod
    def listing_order(cls, orderby: str, desc: bool) -> tuple:
        """``ORDER BY`` of a listing by the column ``orderby``, ties by id the same way.

        One direction for both: on an index of ``(..., orderby)`` (which ends with the
        primary key on MySQL) MariaDB reads a page of ``orderby DESC, id DESC`` off the
        index, but reads and sorts every matching row for ``orderby DESC, id`` (at
        100,000 sessions of an agent: 0.8 against 426 ms).
        """
        column, tie = getattr(cls, orderby), cls._meta.primary_key
        return (column.desc(), tie.desc()) if desc else (column.asc(), tie.asc())


class SchemaVersion(BaseModel):
    """One row per applied migration (see :mod:`api.db.migrations`)."""

    version = IntegerField(primary_key=True)
    name = CharField(max_length=255)
    applied_time = BigIntegerField(default=now_ms)


class Tenant(BaseModel):
    id = CharField(primary_key=True, max_length=32, default=new_id)
    name = CharField(max_length=128, unique=True)
    create_time = BigIntegerField(default=now_ms)


class ApiToken(BaseModel):
    """A bearer token, stored as its sha256; the plain token is shown once.

    ``kind`` is ``api`` (the REST API) or ``embed`` (the embed routes only).
    ``hint`` keeps the first characters so a list can tell tokens apart.
    """

    id = CharField(primary_key=True, max_length=32, default=new_id)
    tenant_id = CharField(max_length=32, index=True)
    kind = CharField(max_length=16, default="api")
    token_hash = CharField(max_length=64, unique=True)
    hint = CharField(max_length=32)
    create_time = BigIntegerField(default=now_ms)


class Agent(BaseModel):
    """An agent: its current DSL and the id of the version that holds it."""

    id = CharField(primary_key=True, max_length=32, default=new_id)
    tenant_id = CharField(max_length=32)
    title = CharField(max_length=255)
    description = TextField(default="")
    dsl = LongTextField()
    version_id = CharField(max_length=32)
    # The parent origins allowed to frame the agent's embed page, as a JSON list
    # (None: only this server itself); see api.services.embed. Not versioned with the DSL.
    embed_origins = TextField(null=True)
    # How long this agent's idle sessions live, in seconds (0: forever); None follows the
    # server's session.ttl_seconds (see api.services.retention).
    session_ttl_seconds = BigIntegerField(null=True)
    # The agent's own rate limits, JSON {"embed": "10/second", "webhook": ...} (api.ratelimit).
    rate_limits = TextField(null=True)
    # The latest published version (``release: true``), or None: new sessions made with
    # ``release`` (and through the embed page and the OpenAI-compatible route) run it.
    release_version_id = CharField(max_length=32, null=True)
    create_time = BigIntegerField(default=now_ms)
    update_time = BigIntegerField(default=now_ms)

    class Meta:
        indexes = ((("tenant_id", "title"), True),)


class AgentVersion(BaseModel):
    """A saved DSL of an agent; sessions are pinned to one."""

    id = CharField(primary_key=True, max_length=32, default=new_id)
    agent_id = CharField(max_length=32)
    number = IntegerField()
    title = CharField(max_length=255)
    dsl = LongTextField()
    # Published (RAGFlow's ``release``); a published version is never changed.
    release = BooleanField(default=False)
    create_time = BigIntegerField(default=now_ms)

    class Meta:
        indexes = ((("agent_id", "number"), True),)


class Session(BaseModel):
    """One conversation and its coordination; its state, the whole canvas as one snapshot,
    is the :class:`SessionSnapshot` row in slot ``state_slot`` (the ring of its kept states,
    see :mod:`api.services.history`).

    ``version`` grows by one with every committed write of the row's state; writes
    are conditional on it. ``lease_owner``/``lease_expires`` mark the turn running
    now (see :mod:`api.services.turns`); ``status`` is ``running`` while a turn holds
    the lease, else ``idle`` or ``paused`` (a form waits: ``pending_form``).
    ``round`` counts the turns that completed or paused (one user message each in
    the message log).
    """

    id = CharField(primary_key=True, max_length=32, default=new_id)
    tenant_id = CharField(max_length=32)
    agent_id = CharField(max_length=32)
    agent_version_id = CharField(max_length=32)
    name = CharField(max_length=255, default="")
    user_id = CharField(max_length=255, default="")
    source = CharField(max_length=16, default="api")
    # The slot of the session's kept states that holds its current state (migration 17
    # moved the snapshot, which the row held until then, there).
    state_slot = IntegerField(default=0)
    version = BigIntegerField(default=1)
    status = CharField(max_length=16, default="idle")
    pending_form = CharField(max_length=255, null=True)
    lease_owner = CharField(max_length=64, null=True)
    lease_expires = BigIntegerField(default=0)
    cancel_requested = BooleanField(default=False)
    # The last turn's task id. Not indexed: a turn sets it (but a resumed one), and on
    # SQLite its index entry cost a page of the WAL per such turn (0.5 of 7.9 per request,
    # bench/wal.py --by-table). A task id begins with its session's id, which finds it
    # (api.services.turns.turn_id).
    task_id = CharField(max_length=64, null=True)
    round = IntegerField(default=0)
    prompt_tokens = BigIntegerField(default=0)
    completion_tokens = BigIntegerField(default=0)
    total_tokens = BigIntegerField(default=0)
    last_error = TextField(null=True)
    # Bytes of the session's message log (content and meta), capped by
    # session.max_transcript_bytes (see api.services.turns).
    transcript_bytes = BigIntegerField(default=0)
    create_time = BigIntegerField(default=now_ms)
    # Not indexed: every turn sets it, and on SQLite an index on it cost a page of the
    # WAL per committed request (1 of 8.9, bench/wal.py --by-table). The sweep finds the
    # sessions that may have expired by ``expiry_mark`` instead, and the sessions listing
    # orders them by ``update_mark``, then ``update_time``.
    update_time = BigIntegerField(default=now_ms)
    # ``update_mark(update_time)``: ``update_time`` rounded down to its 10-minute step.
    # Whatever writes ``update_time`` writes it too, a turn only when the step changed
    # (a separate statement, api.services.turns), so its index entry moves at most once
    # in 10 minutes of a session's turns. Sorted by it, the sessions are in the order of
    # their ``update_time`` but within a step: the listing reads and sorts only the steps
    # that hold its page (api.services.sessions.list_sessions).
    update_mark = BigIntegerField(default=0)
    # A time at or before ``update_time``: the session's creation, or the ``update_time``
    # the sweep last saw when it found the session still in use (0: not known yet, so the
    # sweep looks). Turns never write it, so its index entry moves at most once per
    # session lifetime of an active session (api.services.retention).
    expiry_mark = BigIntegerField(default=0)

    class Meta:
        indexes = (
            (("agent_id", "create_time"), False),
            (("agent_id", "user_id"), False),
            (("expiry_mark",), False),
            (("agent_id", "update_mark"), False),
        )


class MessageLog(BaseModel):
    """The append-only transcript of a session (the snapshot keeps only a bounded history).

    ``abandoned`` marks the messages of a turn that a regenerate or an undo took back:
    they stay in the log, but the session's state no longer follows them.
    """

    id = BigAutoField()
    session_id = CharField(max_length=32)
    round = IntegerField(default=0)
    role = CharField(max_length=16)
    content = LongTextField(default="")
    message_id = CharField(max_length=64, default="")
    meta = LongTextField(null=True)
    abandoned = BooleanField(default=False)
    create_time = BigIntegerField(default=now_ms)

    class Meta:
        indexes = ((("session_id", "id"), False),)


class MemoryEntry(BaseModel):
    """One message of keyed LLM memory (docs/design.md §8): what a node remembers under a key.

    Memory kept under a key such as the user id outlives a session; it belongs to one
    (tenant, agent, key, node) and is read newest first, so the index ends in ``id``.
    Each such group keeps only its newest :data:`agent.memory.MAX_WINDOW` entries
    (:mod:`api.services.memory`). Rows are found by ``key_hash`` (sha256 of the key),
    not by ``memory_key``: a MySQL database made with a case-insensitive or
    space-padding collation would otherwise give user ``Ada`` the memory of ``ada``.
    ``node_id`` is capped at 255 characters so that the index fits MySQL's 3072-byte
    key limit in utf8mb4.
    """

    id = BigAutoField()
    tenant_id = CharField(max_length=32)
    agent_id = CharField(max_length=32)
    key_hash = CharField(max_length=64)
    memory_key = CharField(max_length=255)
    node_id = CharField(max_length=255)
    role = CharField(max_length=16)
    content = LongTextField(default="")
    tokens = IntegerField(default=0)
    # The turn that wrote the entry: an undo or a regenerate of that turn takes it back.
    session_id = CharField(max_length=32, null=True)
    round = IntegerField(null=True)
    # A message of a RAGFlow Memory (api.services.memories) rather than keyed node memory:
    # ``role`` is its message type (raw, semantic, episodic, procedural), ``memory_key``
    # its user id, ``node_id`` empty; ``status`` false keeps it out of searches.
    memory_id = CharField(max_length=32, null=True)
    status = BooleanField(default=True)
    source_id = BigIntegerField(default=0)
    create_time = BigIntegerField(default=now_ms)

    class Meta:
        indexes = (
            (("tenant_id", "agent_id", "key_hash", "node_id", "id"), False),
            (("session_id", "round"), False),
            (("create_time",), False),
            (("memory_id", "id"), False),
        )


class Memory(BaseModel):
    """A long-term Memory as RAGFlow has it (``/memories``): where saved conversations and
    what its LLM extracts from them are kept (as :class:`MemoryEntry` rows, see
    :mod:`api.services.memories`). ``memory_type`` is a JSON list of raw, semantic,
    episodic, procedural; ``memory_size`` caps its messages' bytes (FIFO forgetting)."""

    id = CharField(primary_key=True, max_length=32, default=new_id)
    tenant_id = CharField(max_length=32)
    name = CharField(max_length=128)
    avatar = TextField(default="")
    description = TextField(default="")
    memory_type = TextField(default='["raw"]')
    storage_type = CharField(max_length=16, default="table")
    embd_id = CharField(max_length=255, default="")
    llm_id = CharField(max_length=255, default="")
    permissions = CharField(max_length=16, default="me")
    memory_size = BigIntegerField(default=5 * 1024 * 1024)
    forgetting_policy = CharField(max_length=16, default="FIFO")
    temperature = FloatField(default=0.5)
    system_prompt = TextField(default="")
    user_prompt = TextField(default="")
    create_time = BigIntegerField(default=now_ms)
    update_time = BigIntegerField(default=now_ms)

    class Meta:
        indexes = ((("tenant_id", "create_time"), False),)


class SessionSnapshot(BaseModel):
    """A state of a session: the snapshot it had after ``round`` turns (``packed``: the
    snapshot's UTF-8 or text, or, kept by earlier versions, zlib-compressed;
    :func:`api.services.history.unpack`).

    A session's states form a ring of ``session.keep_snapshots`` + 1 (K + 1) slots: its
    current state, in the slot its row names (``Session.state_slot``), and the K before it
    on its active branch, for regenerate and undo (see :mod:`api.services.history`). A
    turn writes its new state over the oldest, in place (no row added, no index entry
    changed, nothing to delete later).
    """

    id = BigAutoField()
    session_id = CharField(max_length=32)
    slot = IntegerField()
    round = IntegerField()
    packed = LongBlobField()
    create_time = BigIntegerField(default=now_ms)

    class Meta:
        table_name = "kept_state"
        indexes = ((("session_id", "slot"), True),)


class SessionTrash(BaseModel):
    """A deleted or expired session whose messages, snapshots and files still wait for the sweep.

    The session row itself is gone at once (readers no longer see it); the sweep
    (:mod:`api.services.retention`) removes what belonged to it in bounded batches.
    """

    session_id = CharField(primary_key=True, max_length=32)
    deleted_time = BigIntegerField(default=now_ms)


class WorkerLease(BaseModel):
    """A named lease for work that one worker at a time does (the sweep), with the same
    columns and mechanism as a session's turn lease (:mod:`api.services.leases`)."""

    name = CharField(primary_key=True, max_length=64)
    lease_owner = CharField(max_length=64, null=True)
    lease_expires = BigIntegerField(default=0)
    cancel_requested = BooleanField(default=False)


class Dataset(BaseModel):
    """A knowledge base of a tenant (RAGFlow's dataset); see :mod:`api.services.datasets`.

    ``parser_config`` is JSON text; ``embedding_model`` is empty (term search only),
    a model of the default provider or ``model@provider``.
    """

    id = CharField(primary_key=True, max_length=32, default=new_id)
    tenant_id = CharField(max_length=32)
    name = CharField(max_length=128)
    description = TextField(default="")
    avatar = TextField(default="")
    embedding_model = CharField(max_length=255, default="")
    chunk_method = CharField(max_length=32, default="naive")
    parser_config = TextField(default="{}")
    permission = CharField(max_length=16, default="me")
    create_time = BigIntegerField(default=now_ms)
    update_time = BigIntegerField(default=now_ms)

    class Meta:
        indexes = ((("tenant_id", "name"), True),)


class Document(BaseModel):
    """A file of a dataset, and the background task that parses it (see :mod:`api.services.parsing`).

    ``run`` is RAGFlow's state: ``UNSTART``, ``RUNNING`` (queued or being parsed),
    ``CANCEL``, ``DONE``, ``FAIL``. While ``RUNNING`` the row is a task that any worker
    may claim with the lease columns (:mod:`api.services.leases`); ``cancel_requested``
    stops it wherever it runs. The original bytes are kept as :class:`FilePiece` rows
    (``file_id`` = the document id, ``part`` = ``data``).
    """

    id = CharField(primary_key=True, max_length=32, default=new_id)
    tenant_id = CharField(max_length=32)
    dataset_id = CharField(max_length=32)
    name = CharField(max_length=255)
    type = CharField(max_length=16)
    size = BigIntegerField(default=0)
    chunk_method = CharField(max_length=32, default="naive")
    parser_config = TextField(default="{}")
    run = CharField(max_length=16, default="UNSTART")
    progress = FloatField(default=0.0)
    progress_msg = TextField(default="")
    chunk_count = IntegerField(default=0)
    token_count = BigIntegerField(default=0)
    process_begin_at = BigIntegerField(null=True)
    process_duration = FloatField(default=0.0)
    lease_owner = CharField(max_length=64, null=True)
    lease_expires = BigIntegerField(default=0)
    cancel_requested = BooleanField(default=False)
    create_time = BigIntegerField(default=now_ms)
    update_time = BigIntegerField(default=now_ms)

    class Meta:
        indexes = (
            (("dataset_id", "create_time"), False),
            (("run", "lease_expires"), False),
        )


class DocumentPiece(BaseModel):
    """Where migration 4 kept documents' bytes; migration 8 moved them to :class:`FilePiece`
    and dropped the table. Kept only so that migration 4 runs as it shipped."""

    id = BigAutoField()
    document_id = CharField(max_length=32)
    seq = IntegerField()
    data = BlobField()

    class Meta:
        indexes = ((("document_id", "seq"), True),)


class Chunk(BaseModel):
    """A piece of a document's text, the unit of retrieval.

    A parsed chunk has ``chunk_index`` (its place in the document): the pair
    ``(document_id, chunk_index)`` is unique, so a parse resumed by another worker
    never stores a chunk twice. A chunk added by hand has no index. ``embedding``
    is the chunk's vector as packed float32, when the dataset has an embedding model.
    """

    id = CharField(primary_key=True, max_length=32, default=new_id)
    dataset_id = CharField(max_length=32)
    document_id = CharField(max_length=32)
    chunk_index = IntegerField(null=True)
    content = LongTextField(default="")
    important_keywords = TextField(default="[]")
    questions = TextField(default="[]")
    available = BooleanField(default=True)
    token_count = IntegerField(default=0)
    embedding = BlobField(null=True)
    create_time = BigIntegerField(default=now_ms)
    update_time = BigIntegerField(default=now_ms)

    class Meta:
        indexes = (
            (("document_id", "chunk_index"), True),
            (("dataset_id",), False),
        )


class FullTextEntry(BaseModel):
    """One item of the full-text index (see :mod:`api.db.fulltext`); ``length`` counts its tokens."""

    id = BigAutoField()
    scope = CharField(max_length=32)
    group_id = CharField(max_length=64)
    item_id = CharField(max_length=64)
    length = IntegerField(default=0)
    terms = LongTextField(default="")

    class Meta:
        table_name = "fulltext_entry"
        indexes = (
            (("scope", "item_id"), False),
            (("scope", "group_id"), False),
        )


class UploadFile(BaseModel):
    """A file uploaded for conversations (docs/design.md §13): its descriptor and where its bytes are.

    Files are the tenant's; one uploaded through the embed page is also its visitor's
    (``end_user``, the page's ``user_id``) and only that visitor can use it. The bytes,
    and for a document its parsed text, are in :class:`FilePiece` rows (``store`` =
    ``database``) or in files under the configured directory (``store`` =
    ``directory``); see :mod:`api.services.files`.
    """

    id = CharField(primary_key=True, max_length=32, default=new_id)
    tenant_id = CharField(max_length=32)
    agent_id = CharField(max_length=32)
    end_user = CharField(max_length=255, null=True)
    created_by = CharField(max_length=255)
    name = CharField(max_length=255)
    size = BigIntegerField()
    extension = CharField(max_length=32)
    mime_type = CharField(max_length=128)
    kind = CharField(max_length=16)
    store = CharField(max_length=16, default="database")
    sha256 = CharField(max_length=64)
    text_chars = BigIntegerField(default=0)
    create_time = BigIntegerField(default=now_ms)
    #: Whether the sessions that use it are recorded (:class:`SessionFile`), so the sweep
    #: may remove it: true for every upload since migration 15; older ones stay (false)
    #: until their agent is deleted, since nothing says which sessions still read them.
    sweepable = BooleanField(default=True)

    class Meta:
        indexes = ((("tenant_id", "create_time"), False),)


class SessionFile(BaseModel):
    """A session used an uploaded file (attached to a turn or answered in a ``file``
    field), recorded with the turn's commit. The sweep removes a file once no session
    that used it is left (:mod:`api.services.retention`)."""

    session_id = CharField(max_length=32)
    file_id = CharField(max_length=32)

    class Meta:
        primary_key = CompositeKey("session_id", "file_id")
        indexes = ((("file_id",), False),)


class FilePiece(BaseModel):
    """One piece of a stored file: ``part`` is ``data`` (the bytes) or ``text`` (parsed
    text, UTF-8); pieces are small enough for MySQL's ``max_allowed_packet``."""

    id = BigAutoField()
    file_id = CharField(max_length=32)
    part = CharField(max_length=8)
    seq = IntegerField()
    data = LongBlobField()

    class Meta:
        indexes = ((("file_id", "part", "seq"), True),)


class RateLimitCounter(BaseModel):
    """A fixed-window request count shared by every worker (see :mod:`api.ratelimit`)."""

    key = CharField(primary_key=True, max_length=255)
    count = BigIntegerField(default=0)
    expires_at = BigIntegerField(index=True)


class McpServer(BaseModel):
    """An MCP server of a tenant (RAGFlow's ``/mcp/servers``): where it is, how to reach
    it, and the tools it listed when it was saved (``variables["tools"]``, by name)."""

    id = CharField(primary_key=True, max_length=32, default=new_id)
    tenant_id = CharField(max_length=32)
    name = CharField(max_length=255)
    url = TextField()
    server_type = CharField(max_length=32)
    description = TextField(default="")
    # JSON objects. Header values may be tokens: never returned unmasked.
    headers = TextField(default="{}")
    variables = LongTextField(default="{}")
    create_time = BigIntegerField(default=now_ms)
    update_time = BigIntegerField(default=now_ms)

    class Meta:
        indexes = ((("tenant_id", "name"), True),)


class WebhookLog(BaseModel):
    """One run of an agent's webhook (``/agents/<id>/webhook/logs``): when, how it
    ended, and its events."""

    id = CharField(primary_key=True, max_length=32, default=new_id)
    agent_id = CharField(max_length=32)
    tenant_id = CharField(max_length=32)
    session_id = CharField(max_length=32, default="")
    method = CharField(max_length=16)
    remote_addr = CharField(max_length=64, default="")
    status = CharField(max_length=16, default="running")  # running, succeeded, failed
    error = TextField(default="")
    events = LongTextField(default="[]")
    start_ms = BigIntegerField(default=now_ms)
    end_ms = BigIntegerField(null=True)

    class Meta:
        indexes = ((("agent_id", "start_ms"), False),)


ALL_MODELS = (
    SchemaVersion,
    Tenant,
    ApiToken,
    Agent,
    AgentVersion,
    Session,
    MessageLog,
    MemoryEntry,
    SessionSnapshot,
    SessionTrash,
    WorkerLease,
    Memory,
    Dataset,
    Document,
    Chunk,
    FullTextEntry,
    UploadFile,
    FilePiece,
    SessionFile,
    RateLimitCounter,
    McpServer,
    WebhookLog,
)
