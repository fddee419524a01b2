"""Files in conversations (docs/design.md §13): uploads, storage, and the turn's file service.

* :func:`save_uploads` checks every file of a request (size, type, a document's
  parse) before it stores any, then stores them all in one transaction: a request
  with one bad file stores nothing.
* Storage is the database by default — :class:`~api.db.FilePiece` rows of at most
  ``files.piece_bytes`` each, well under MySQL's ``max_allowed_packet``, so every
  worker sees every file with no extra service — or a directory
  (``files.store: directory``, ``files.directory``) that every worker shares.
  A document's parsed text is stored beside its bytes, so a turn never parses.
* :class:`TurnFiles` is the :class:`agent.files.FileService` a turn's canvas gets:
  it finds files of the turn's tenant only and, for an embed visitor, of that visitor
  only; anything else is "not found", like every foreign id.
* **A file lives as long as the sessions that use it.** Uploads are made for an agent,
  not a session (RAGFlow's route takes no session), so a file is tied to a session when
  a turn of that session takes it (attached, or answered in a ``file`` field): the
  turn's commit records a :class:`~api.db.SessionFile` row (:func:`record_session_files`).
  When the sweep clears out deleted or expired sessions it removes their files that no
  other session uses (:func:`delete_unused_files`), and it removes uploads that no
  session took within the session lifetime (the agent's ``session_ttl_seconds``, else
  ``session.ttl_seconds``; none when that is 0) — see :mod:`api.services.retention`.
  Files uploaded before this was recorded (``sweepable`` false) are left alone, since
  nothing says which sessions still read them; they go with their agent.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from peewee import fn

from agent.docparse import SUPPORTED_IMAGE_TYPES
from agent.files import check_file, is_file_list, ref_id
from agent.settings import data_home
from api.db import FilePiece, SessionFile, UploadFile, db, write_transaction
from api.errors import ArgumentError, NotFound, TooLarge

log = logging.getLogger("agentcanvas.files")

STORES = ("database", "directory")
MAX_NAME_CHARS = 255


@dataclass(frozen=True)
class FileSettings:
    """The ``files`` section and the file limits.

    Attributes:
        store: ``database`` or ``directory``.
        directory: where ``directory`` keeps files (every worker must see it).
        piece_bytes: the largest piece written to the database in one statement.
        max_files_per_request: files one upload request may carry.
        max_file_bytes: the largest file (``limits.max_file_bytes``,
            ``AGENTCANVAS_MAX_FILE_BYTES``).
    """

    store: str = "database"
    directory: str = ""
    piece_bytes: int = 1024 * 1024
    max_files_per_request: int = 10
    max_file_bytes: int = 32 * 1024 * 1024

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> FileSettings:
        files = dict(config.get("FILES") or {})
        limits = config.get("LIMITS") or {}
        out = cls(
            store=str(files.get("store") or "database"),
            # A relative directory is under AGENTCANVAS_HOME, like a relative SQLite path.
            directory=str(data_home() / files["directory"]) if files.get("directory") else "",
            piece_bytes=int(files.get("piece_bytes") or cls.piece_bytes),
            max_files_per_request=int(files.get("max_files_per_request") or cls.max_files_per_request),
            max_file_bytes=int(limits.get("max_file_bytes") or cls.max_file_bytes),
        )
        out.check()
        return out

    def check(self) -> None:
        """Raise ``ValueError`` naming a setting that cannot work."""
        if self.store not in STORES:
            raise ValueError(f"files.store must be one of {', '.join(STORES)}, got {self.store!r}")
        if self.store == "directory" and not self.directory:
            raise ValueError("files.store is 'directory' but files.directory names no directory")
        for name in ("piece_bytes", "max_files_per_request", "max_file_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"files setting {name} must be positive, got {getattr(self, name)!r}")

    def upload_body_limit(self) -> int:
        """The largest upload request body: every file at the limit, plus room for the form."""
        return self.max_file_bytes * self.max_files_per_request + 1024 * 1024


def descriptor(row: UploadFile) -> dict:
    """RAGFlow's upload answer for a stored file."""
    return {
        "id": row.id,
        "name": row.name,
        "size": row.size,
        "extension": row.extension,
        "mime_type": row.mime_type,
        "created_by": row.created_by,
        "created_at": row.create_time / 1000,
        "preview_url": None,
    }


# ---------------------------------------------------------------------- uploads
@dataclass
class _Checked:
    name: str
    stream: IO[bytes]
    size: int
    sha256: str
    kind: str
    mime_type: str
    text: str


def save_uploads(
    uploads: list,
    *,
    tenant_id: str,
    agent_id: str,
    created_by: str,
    end_user: str | None,
    settings: FileSettings,
) -> list[dict]:
    """Check and store the files of one upload request; returns their descriptors.

    Args:
        uploads: werkzeug ``FileStorage`` objects (``filename``, ``mimetype``, ``stream``).
        end_user: the embed visitor who uploads (None for an API caller).

    Raises:
        ArgumentError: no file, too many files, an empty, unnamed, unsupported or
            unreadable file (the message names it). Nothing is stored.
        TooLarge: a file over ``max_file_bytes``. Nothing is stored.
    """
    if not uploads:
        raise ArgumentError("no file: send the files as multipart/form-data parts named 'file'")
    if len(uploads) > settings.max_files_per_request:
        raise ArgumentError(
            f"{len(uploads)} files in one request; the limit is {settings.max_files_per_request} "
            f"(files.max_files_per_request): upload them in several requests"
        )
    checked = [_check_upload(upload, settings) for upload in uploads]
    return _store(checked, tenant_id, agent_id, created_by, end_user, settings)


def _check_upload(upload: Any, settings: FileSettings) -> _Checked:
    name = os.path.basename((upload.filename or "").replace("\\", "/")).strip()
    if not name:
        raise ArgumentError("a 'file' part has no file name; send each file with its name")
    if len(name) > MAX_NAME_CHARS:
        raise ArgumentError(f"the file name {name[:40]!r}… is longer than {MAX_NAME_CHARS} characters")
    stream = upload.stream
    data = stream.read(settings.max_file_bytes + 1)
    if len(data) > settings.max_file_bytes:
        raise TooLarge(
            f"{name!r} is larger than {settings.max_file_bytes} bytes, the limit for one file "
            f"(AGENTCANVAS_MAX_FILE_BYTES)"
        )
    try:
        kind, mime_type, text = check_file(name, upload.mimetype, data)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
    size, digest = len(data), hashlib.sha256(data).hexdigest()
    stream.seek(0)
    # Only one file's bytes are held at a time; they are read again when stored.
    return _Checked(name, stream, size, digest, kind, mime_type, text)


def _store(
    checked: list[_Checked],
    tenant_id: str,
    agent_id: str,
    created_by: str,
    end_user: str | None,
    settings: FileSettings,
) -> list[dict]:
    rows = [
        UploadFile(
            tenant_id=tenant_id,
            agent_id=agent_id,
            end_user=end_user,
            created_by=created_by,
            name=c.name,
            size=c.size,
            extension=c.kind,
            mime_type=c.mime_type,
            kind="image" if c.kind in SUPPORTED_IMAGE_TYPES else "document",
            store=settings.store,
            sha256=c.sha256,
            text_chars=len(c.text),
        )
        for c in checked
    ]
    written: list[Path] = []
    try:
        if settings.store == "directory":
            for row, c in zip(rows, checked, strict=True):
                written += _write_directory(settings, row, c)
        with write_transaction():
            for row, c in zip(rows, checked, strict=True):
                row.save(force_insert=True)
                if settings.store == "database":
                    write_pieces(row.id, "data", c.stream.read(), settings.piece_bytes)
                    write_pieces(row.id, "text", c.text.encode("utf-8"), settings.piece_bytes)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return [descriptor(row) for row in rows]


def write_pieces(file_id: str, part: str, data: bytes, piece_bytes: int) -> None:
    """Store ``data`` as ``FilePiece`` rows of ``file_id`` (also a dataset document's bytes)."""
    # One INSERT per piece: each statement stays under the server's packet limit.
    for seq, start in enumerate(range(0, len(data), piece_bytes)):
        FilePiece.insert(
            file_id=file_id, part=part, seq=seq, data=data[start : start + piece_bytes]
        ).execute()


def _paths(settings: FileSettings, row: UploadFile) -> dict[str, Path]:
    base = Path(settings.directory) / row.tenant_id
    return {"data": base / f"{row.id}.data", "text": base / f"{row.id}.txt"}


def _write_directory(settings: FileSettings, row: UploadFile, c: _Checked) -> list[Path]:
    paths = _paths(settings, row)
    paths["data"].parent.mkdir(parents=True, exist_ok=True)
    done = []
    for part, content in (("data", c.stream.read()), ("text", c.text.encode("utf-8"))):
        # Written whole under a temporary name, then renamed: never a half file.
        fd, tmp = tempfile.mkstemp(dir=paths[part].parent, prefix=".upload-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
        os.replace(tmp, paths[part])
        done.append(paths[part])
    return done


def delete_agent_files(agent_id: str) -> list[UploadFile]:
    """Forget the files uploaded for an agent (inside the agent's delete transaction).

    Returns the rows forgotten: a directory store's files are removed after the commit
    with :func:`remove_stored_files` (removed before it, a delete that rolls back would
    have lost them).
    """
    rows = list(
        UploadFile.select(UploadFile.id, UploadFile.tenant_id, UploadFile.store).where(
            UploadFile.agent_id == agent_id
        )
    )
    ids = UploadFile.select(UploadFile.id).where(UploadFile.agent_id == agent_id)
    FilePiece.delete().where(FilePiece.file_id.in_(ids)).execute()
    UploadFile.delete().where(UploadFile.agent_id == agent_id).execute()
    return rows


# ---------------------------------------------------------------------- sessions' files
def files_of_turn(attached: list, answers: dict) -> list[str]:
    """The ids of the files a turn took: ``attached`` (descriptors or bare ids) and the
    descriptor lists among the form ``answers``."""
    ids = {ref_id(ref) for ref in attached if isinstance(ref, (str, dict))} if attached else set()
    for value in answers.values():
        if is_file_list(value):
            ids.update(d["id"] for d in value)
    return sorted(i for i in ids if i) if ids else []


def record_session_files(session_id: str, file_ids: list[str]) -> None:
    """Record that the session uses these files (inside the turn's write transaction)."""
    if file_ids:
        SessionFile.insert_many(
            [{"session_id": session_id, "file_id": file_id} for file_id in file_ids]
        ).on_conflict_ignore().execute()


def delete_unused_files(file_ids: list[str]) -> list[UploadFile]:
    """Delete those of ``file_ids`` that no session uses any more (and that the sweep may
    remove, see the module docstring), with their database pieces; inside the caller's
    write transaction. Returns the rows deleted: a directory store's files are removed
    after the commit with :func:`remove_stored_files`.

    A turn that takes the file while this runs in another session could record its use
    just after the file is gone; that turn has read the file already, a later one of that
    session finds it missing.
    """
    if not file_ids:
        return []
    unused = list(
        UploadFile.select(UploadFile.id, UploadFile.tenant_id, UploadFile.store).where(
            UploadFile.id.in_(file_ids)
            & UploadFile.sweepable
            & ~fn.EXISTS(SessionFile.select(SessionFile.file_id).where(SessionFile.file_id == UploadFile.id))
        )
    )
    if unused:
        ids = [row.id for row in unused]
        FilePiece.delete().where(FilePiece.file_id.in_(ids)).execute()
        UploadFile.delete().where(UploadFile.id.in_(ids)).execute()
    return unused


def remove_stored_files(rows: list[UploadFile], settings: FileSettings | None) -> None:
    """Remove the directory store's files of rows already deleted (after the commit)."""
    for row in rows:
        if row.store != "directory":
            continue
        if settings is None or not settings.directory:
            log.warning(
                "file %s is in a directory store, and files.directory is not set: left on disk", row.id
            )
            continue
        for path in _paths(settings, row).values():
            path.unlink(missing_ok=True)


# ---------------------------------------------------------------------- reading
def find_file(
    tenant_id: str, file_id: str, end_user: str | None = None, agent_id: str | None = None
) -> UploadFile:
    """The tenant's file (and, for an embed visitor, that visitor's file of this agent).

    Raises:
        NotFound: no such file for this caller (another tenant's or visitor's included).
    """
    row = None
    if isinstance(file_id, str) and 0 < len(file_id) <= 64:
        cond = (UploadFile.id == file_id) & (UploadFile.tenant_id == tenant_id)
        if end_user is not None:
            cond &= (UploadFile.end_user == end_user) & (UploadFile.agent_id == agent_id)
        row = UploadFile.get_or_none(cond)
    if row is None:
        raise NotFound(f"file {file_id!r} not found")
    return row


def read_part(row: UploadFile, part: str, settings: FileSettings | None = None) -> bytes:
    """A stored file's ``data`` (bytes) or ``text`` (parsed text, UTF-8)."""
    if row.store == "directory":
        if settings is None or not settings.directory:
            raise RuntimeError(f"file {row.id!r} is in a directory store, and files.directory is not set")
        return _paths(settings, row)[part].read_bytes()
    return read_pieces(row.id, part)


def read_pieces(file_id: str, part: str) -> bytes:
    """The bytes :func:`write_pieces` stored."""
    pieces = (
        FilePiece.select(FilePiece.data)
        .where((FilePiece.file_id == file_id) & (FilePiece.part == part))
        .order_by(FilePiece.seq)
        .tuples()
    )
    return b"".join(bytes(data) for (data,) in pieces)


class TurnFiles:
    """The file service of one turn (:class:`agent.files.FileService`).

    Args:
        tenant_id: the turn's tenant; no other tenant's file is ever found.
        agent_id: the agent the turn runs.
        end_user: the embed visitor, whose own uploads are the only files it may use.
        settings: where files are stored.
    """

    #: Parsed texts kept per process, by file id (a file never changes once stored),
    #: the oldest dropped past ``_TEXTS_MAX_CHARS`` in all; a larger text is not kept.
    _texts: dict[str, str] = {}
    _texts_chars = 0
    _texts_lock = threading.Lock()
    _TEXTS_MAX_CHARS = 8_000_000

    def __init__(self, tenant_id: str, agent_id: str, end_user: str | None, settings: FileSettings):
        self.tenant_id = tenant_id
        self.agent_id = agent_id
        self.end_user = end_user
        self.settings = settings
        self._rows: dict[str, UploadFile] = {}

    def resolve(self, refs: list) -> list[dict]:
        out = []
        for ref in refs:
            file_id = ref_id(ref)
            try:
                row = self._row(file_id)
            except NotFound:
                raise ValueError(
                    f"file {file_id!r} not found; upload it first (POST /agents/<id>/upload) and send its id"
                ) from None
            out.append(descriptor(row))
        return out

    def read(self, descriptor: dict) -> bytes:
        return self._read(str(descriptor.get("id")), "data")

    def text(self, descriptor: dict) -> str:
        file_id = str(descriptor.get("id"))
        with self._texts_lock:
            cached = self._texts.get(file_id)
        if cached is not None:
            return cached
        text = self._read(file_id, "text").decode("utf-8")
        cls = type(self)
        with cls._texts_lock:
            if len(text) <= cls._TEXTS_MAX_CHARS // 4 and file_id not in cls._texts:
                while cls._texts and cls._texts_chars + len(text) > cls._TEXTS_MAX_CHARS:
                    cls._texts_chars -= len(cls._texts.pop(next(iter(cls._texts))))
                cls._texts[file_id] = text
                cls._texts_chars += len(text)
        return text

    def _row(self, file_id: str) -> UploadFile:
        row = self._rows.get(file_id)
        if row is None:
            # The canvas may run in the turn's worker thread, which holds no connection.
            with db.connection_context():
                row = find_file(self.tenant_id, file_id, self.end_user, self.agent_id)
            self._rows[file_id] = row
        return row

    def _read(self, file_id: str, part: str) -> bytes:
        row = self._row(file_id)
        with db.connection_context():
            return read_part(row, part, self.settings)
