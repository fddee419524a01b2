"""Knowledge bases: datasets, their documents and chunks (RAGFlow's dataset API).

Everything here is the tenant's: another tenant's dataset, document or chunk is
answered exactly like a missing one (404). Writes that belong together — a
document's pieces, a chunk and its index entry, a dataset and everything in it —
happen in one transaction, so a refused or failed request stores nothing.

Parsing runs in the background (:mod:`api.services.parsing`); searching is in
:mod:`api.services.retrieval`. Limits (``datasets`` settings, see
:class:`KnowledgeLimits`): size of one file, files per upload, chunks per dataset.
"""

from __future__ import annotations

import array
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from peewee import IntegrityError, fn

from agent import docparse
from agent.chunking import DEFAULT_CHUNK_TOKENS, DEFAULT_DELIMITER, MAX_CHUNK_TOKENS, token_count
from api.db import Chunk, Dataset, Document, FilePiece, new_id, now_ms, write_transaction
from api.db.fulltext import FullTextIndex
from api.errors import ArgumentError, Conflict, NotFound, TooLarge
from api.services import files as file_store

#: The full-text scope of dataset chunks (groups are dataset ids).
CHUNKS = FullTextIndex("chunk")
CHUNK_METHODS = ("naive",)
RUN_STATES = ("UNSTART", "RUNNING", "CANCEL", "DONE", "FAIL")
DATASET_ORDER = ("create_time", "update_time", "name")
DOCUMENT_ORDER = ("create_time", "update_time", "name", "size")
MAX_NAME = 128
MAX_DOC_NAME = 255
#: Bytes per stored piece of a document (well under MySQL's default 16 MiB packet).
PIECE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class KnowledgeLimits:
    """The ``datasets`` settings (``AGENTCANVAS_DATASETS_<NAME>``)."""

    max_file_bytes: int = 32 * 1024 * 1024
    max_files_per_request: int = 32
    max_chunks_per_dataset: int = 200_000
    parse_threads: int = 1
    embedding_batch: int = 32

    @classmethod
    def from_settings(cls, settings: dict | None) -> KnowledgeLimits:
        section = (settings or {}).get("datasets") or {}
        values = {}
        for name in cls.__dataclass_fields__:
            raw = section.get(name)
            if raw in (None, ""):
                continue
            try:
                values[name] = int(raw)
            except (TypeError, ValueError):
                raise ValueError(f"setting datasets.{name} must be a whole number, got {raw!r}") from None
            if values[name] < (0 if name == "parse_threads" else 1):
                raise ValueError(f"setting datasets.{name} must be positive, got {raw!r}")
        return cls(**values)


# ---------------------------------------------------------------------- shapes
def _date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%a, %d %b %Y %H:%M:%S GMT")


def _json_field(text: str, default: Any) -> Any:
    try:
        return json.loads(text or "")
    except ValueError:
        return default


def dataset_json(ds: Dataset, counts: tuple[int, int, int] | None = None) -> dict:
    """RAGFlow's dataset object; ``counts`` = (documents, chunks, tokens)."""
    documents, chunks, tokens = (
        counts if counts is not None else dataset_counts([ds.id]).get(ds.id, (0, 0, 0))
    )
    return {
        "id": ds.id,
        "name": ds.name,
        "avatar": ds.avatar,
        "description": ds.description,
        "tenant_id": ds.tenant_id,
        "created_by": ds.tenant_id,
        "embedding_model": ds.embedding_model,
        "permission": ds.permission,
        "chunk_method": ds.chunk_method,
        "parser_config": _json_field(ds.parser_config, {}),
        "document_count": documents,
        "chunk_count": chunks,
        "token_num": tokens,
        "language": "English",
        "pagerank": 0,
        "similarity_threshold": 0.2,
        "vector_similarity_weight": 0.3,
        "status": "1",
        "create_time": ds.create_time,
        "create_date": _date(ds.create_time),
        "update_time": ds.update_time,
        "update_date": _date(ds.update_time),
    }


def document_json(doc: Document) -> dict:
    """RAGFlow's document object (``run``, ``progress``, ``progress_msg``...)."""
    return {
        "id": doc.id,
        "name": doc.name,
        "dataset_id": doc.dataset_id,
        "knowledgebase_id": doc.dataset_id,
        "type": doc.type,
        "size": doc.size,
        "chunk_method": doc.chunk_method,
        "parser_config": _json_field(doc.parser_config, {}),
        "run": doc.run,
        "progress": round(float(doc.progress or 0.0), 4),
        "progress_msg": doc.progress_msg or "",
        "chunk_count": doc.chunk_count,
        "token_count": doc.token_count,
        "process_begin_at": _date(doc.process_begin_at) if doc.process_begin_at else None,
        "process_duration": doc.process_duration,
        "source_type": "local",
        "location": doc.name,
        "created_by": doc.tenant_id,
        "status": "1",
        "meta_fields": {},
        "thumbnail": None,
        "create_time": doc.create_time,
        "create_date": _date(doc.create_time),
        "update_time": doc.update_time,
        "update_date": _date(doc.update_time),
    }


def chunk_json(chunk: Chunk, document_name: str = "") -> dict:
    """RAGFlow's chunk object as ``list_chunks`` and ``add_chunk`` answer it."""
    return {
        "id": chunk.id,
        "content": chunk.content,
        "document_id": chunk.document_id,
        "docnm_kwd": document_name,
        "document_keyword": document_name,
        "document_name": document_name,
        "dataset_id": chunk.dataset_id,
        "important_keywords": _json_field(chunk.important_keywords, []),
        "questions": _json_field(chunk.questions, []),
        "available": bool(chunk.available),
        "image_id": "",
        "positions": [],
        "token_count": chunk.token_count,
        "create_time": _date(chunk.create_time),
        "create_timestamp": chunk.create_time / 1000,
    }


def dataset_counts(dataset_ids: list[str]) -> dict[str, tuple[int, int, int]]:
    """``{dataset id: (documents, chunks, tokens)}``."""
    if not dataset_ids:
        return {}
    rows = (
        Document.select(
            Document.dataset_id,
            fn.COUNT(Document.id),
            fn.SUM(Document.chunk_count),
            fn.SUM(Document.token_count),
        )
        .where(Document.dataset_id.in_(dataset_ids))
        .group_by(Document.dataset_id)
        .tuples()
    )
    return {r[0]: (int(r[1] or 0), int(r[2] or 0), int(r[3] or 0)) for r in rows}


# ---------------------------------------------------------------------- checks
def _text(body: dict, name: str, max_length: int, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise ArgumentError(f"{name!r} is required")
        return None
    if not isinstance(value, str):
        raise ArgumentError(f"{name!r} must be text, got {type(value).__name__}")
    value = value.strip()
    if required and not value:
        raise ArgumentError(f"{name!r} must not be empty")
    if len(value) > max_length:
        raise ArgumentError(f"{name!r} is {len(value)} characters long; the limit is {max_length}")
    return value


def check_parser_config(value: Any, base: dict | None = None) -> dict:
    """``parser_config`` merged over ``base``: ``chunk_token_num`` 1–8192, ``delimiter`` text."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ArgumentError(f"'parser_config' must be an object, got {type(value).__name__}")
    config = {
        "chunk_token_num": DEFAULT_CHUNK_TOKENS,
        "delimiter": DEFAULT_DELIMITER,
        **(base or {}),
        **value,
    }
    tokens = config.get("chunk_token_num")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_CHUNK_TOKENS:
        raise ArgumentError(
            f"'parser_config.chunk_token_num' must be a whole number from 1 to {MAX_CHUNK_TOKENS}, got {tokens!r}"
        )
    if not isinstance(config.get("delimiter"), str) or not config["delimiter"]:
        raise ArgumentError(
            f"'parser_config.delimiter' must be non-empty text, got {config.get('delimiter')!r}"
        )
    return config


def _check_chunk_method(value: Any) -> str:
    if value is None:
        return "naive"
    if value not in CHUNK_METHODS:
        raise ArgumentError(
            f"'chunk_method' {value!r} is not supported; use one of {', '.join(CHUNK_METHODS)}"
        )
    return value


def check_embedding_model(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > 255:
        raise ArgumentError(f"'embedding_model' must be a model name (or 'model@provider'), got {value!r}")
    return value.strip()


# ---------------------------------------------------------------------- datasets
def get_dataset(tenant_id: str, dataset_id: Any) -> Dataset:
    """The tenant's dataset; another tenant's is reported exactly like a missing one."""
    if not isinstance(dataset_id, str) or not dataset_id:
        raise ArgumentError(f"a dataset id must be text, got {dataset_id!r}")
    ds = Dataset.get_or_none((Dataset.id == dataset_id) & (Dataset.tenant_id == tenant_id))
    if ds is None:
        raise NotFound(f"dataset {dataset_id!r} not found")
    return ds


def check_dataset_ids(tenant_id: str, ids: Any, name: str = "dataset_ids") -> list[str]:
    """``ids`` as a list of this tenant's dataset ids; a missing or foreign one is a 404 naming it."""
    if isinstance(ids, str):
        ids = [ids]
    if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
        raise ArgumentError(f"{name!r} must be a list of dataset ids, got {ids!r}")
    ids = list(dict.fromkeys(ids))
    found = {
        d.id for d in Dataset.select(Dataset.id).where(Dataset.id.in_(ids) & (Dataset.tenant_id == tenant_id))
    }
    missing = [i for i in ids if i not in found]
    if missing:
        raise NotFound(f"{name}: dataset {missing[0]!r} not found")
    return ids


def create_dataset(tenant_id: str, body: dict) -> Dataset:
    name = _text(body, "name", MAX_NAME, required=True)
    chunk_method = _check_chunk_method(body.get("chunk_method"))
    now = now_ms()
    try:
        with write_transaction():
            return Dataset.create(
                tenant_id=tenant_id,
                name=name,
                description=_text(body, "description", 65_535) or "",
                avatar=_text(body, "avatar", 65_535) or "",
                embedding_model=check_embedding_model(body.get("embedding_model")),
                chunk_method=chunk_method,
                permission=_check_permission(body.get("permission")),
                parser_config=json.dumps(check_parser_config(body.get("parser_config"))),
                create_time=now,
                update_time=now,
            )
    except IntegrityError:
        raise Conflict(f"a dataset named {name!r} already exists; choose another name") from None


def _check_permission(value: Any) -> str:
    if value in (None, ""):
        return "me"
    if value not in ("me", "team"):
        raise ArgumentError(f"'permission' must be 'me' or 'team', got {value!r}")
    return value


def list_datasets(
    tenant_id: str,
    page: int,
    page_size: int,
    orderby: str,
    desc: bool,
    dataset_id: str | None,
    name: str | None,
) -> tuple[list[dict], int]:
    query = Dataset.select().where(Dataset.tenant_id == tenant_id)
    if dataset_id:
        query = query.where(Dataset.id == dataset_id)
    if name:
        query = query.where(Dataset.name == name)
    total = query.count()
    rows = list(query.order_by(*Dataset.listing_order(orderby, desc)).paginate(page, page_size))
    if (dataset_id or name) and not rows and page == 1:
        what = f"id {dataset_id!r}" if dataset_id else f"name {name!r}"
        raise NotFound(f"no dataset with {what}")
    counts = dataset_counts([d.id for d in rows])
    return [dataset_json(d, counts.get(d.id, (0, 0, 0))) for d in rows], total


def update_dataset(tenant_id: str, dataset_id: str, body: dict) -> Dataset:
    ds = get_dataset(tenant_id, dataset_id)
    changes: dict[str, Any] = {}
    if "name" in body:
        changes["name"] = _text(body, "name", MAX_NAME, required=True)
    for key in ("description", "avatar"):
        if key in body:
            changes[key] = _text(body, key, 65_535) or ""
    if "chunk_method" in body:
        changes["chunk_method"] = _check_chunk_method(body["chunk_method"])
    if "permission" in body:
        changes["permission"] = _check_permission(body["permission"])
    if "parser_config" in body:
        base = _json_field(ds.parser_config, {})
        changes["parser_config"] = json.dumps(check_parser_config(body["parser_config"], base))
    if "embedding_model" in body:
        model = check_embedding_model(body["embedding_model"])
        if model != ds.embedding_model and Chunk.select().where(Chunk.dataset_id == ds.id).exists():
            raise ArgumentError(
                "'embedding_model' cannot change while the dataset has chunks (their vectors would not match); "
                "delete its documents first"
            )
        changes["embedding_model"] = model
    if not changes:
        return ds
    changes["update_time"] = now_ms()
    try:
        with write_transaction():
            Dataset.update(changes).where(Dataset.id == ds.id).execute()
    except IntegrityError:
        raise Conflict(
            f"a dataset named {changes.get('name')!r} already exists; choose another name"
        ) from None
    return get_dataset(tenant_id, dataset_id)


def delete_datasets(tenant_id: str, ids: Any, delete_all: bool = False) -> int:
    """Delete datasets with their documents, chunks and index entries; all named must exist."""
    if delete_all:
        ids = [d.id for d in Dataset.select(Dataset.id).where(Dataset.tenant_id == tenant_id)]
    elif ids is None:
        return 0
    else:
        ids = check_dataset_ids(tenant_id, ids, "ids")
    if not ids:
        return 0
    with write_transaction():
        doc_ids = [d.id for d in Document.select(Document.id).where(Document.dataset_id.in_(ids))]
        _delete_document_rows(doc_ids)
        CHUNKS.remove_groups(ids)
        Chunk.delete().where(Chunk.dataset_id.in_(ids)).execute()
        Dataset.delete().where(Dataset.id.in_(ids)).execute()
    return len(ids)


# ---------------------------------------------------------------------- documents
def get_document(tenant_id: str, dataset_id: str, document_id: str) -> Document:
    ds = get_dataset(tenant_id, dataset_id)
    doc = Document.get_or_none((Document.id == document_id) & (Document.dataset_id == ds.id))
    if doc is None:
        raise NotFound(f"document {document_id!r} not found in dataset {dataset_id!r}")
    return doc


def upload_documents(
    tenant_id: str, dataset_id: str, files: list[tuple[str, bytes]], limits: KnowledgeLimits
) -> list[Document]:
    """Store ``(file name, bytes)`` as new ``UNSTART`` documents, all or none.

    Raises:
        ArgumentError: no file, an empty name or file, an unsupported type (naming the supported ones).
        TooLarge: a file over ``max_file_bytes``, or more than ``max_files_per_request`` files.
    """
    ds = get_dataset(tenant_id, dataset_id)
    if not files:
        raise ArgumentError("no file: send the documents as multipart form field 'file'")
    if len(files) > limits.max_files_per_request:
        raise TooLarge(
            f"{len(files)} files in one request; the limit is {limits.max_files_per_request} "
            f"(datasets.max_files_per_request)"
        )
    checked = []
    for name, data in files:
        name = (name or "").strip()
        if not name:
            raise ArgumentError("'file': a file has no name; send each file with its file name")
        if len(name) > MAX_DOC_NAME:
            raise ArgumentError(f"'file': the name {name[:40]!r}... is longer than {MAX_DOC_NAME} characters")
        if len(data) > limits.max_file_bytes:
            raise TooLarge(
                f"'file': {name!r} is {len(data)} bytes; the limit is {limits.max_file_bytes} "
                f"(datasets.max_file_bytes)"
            )
        if not data:
            raise ArgumentError(f"'file': {name!r} is empty")
        try:
            kind = docparse.document_type(name)
        except docparse.UnsupportedFileType:
            raise ArgumentError(
                f"'file': {name!r} is not a supported document type; supported: "
                f"{', '.join(docparse.SUPPORTED_DOCUMENT_TYPES)}"
            ) from None
        checked.append((name, kind, data))
    now = now_ms()
    docs = []
    with write_transaction():
        for name, kind, data in checked:
            doc = Document.create(
                id=new_id(),
                tenant_id=tenant_id,
                dataset_id=ds.id,
                name=name,
                type=kind,
                size=len(data),
                chunk_method=ds.chunk_method,
                parser_config=ds.parser_config,
                create_time=now,
                update_time=now,
            )
            file_store.write_pieces(doc.id, "data", data, PIECE_BYTES)
            docs.append(doc)
        Dataset.update(update_time=now).where(Dataset.id == ds.id).execute()
    return docs


def document_bytes(document_id: str) -> bytes:
    """The original bytes of a document (kept as file pieces, see :mod:`api.services.files`)."""
    return file_store.read_pieces(document_id, "data")


def list_documents(
    tenant_id: str,
    dataset_id: str,
    page: int,
    page_size: int,
    orderby: str,
    desc: bool,
    ids: list[str],
    name: str | None,
    keywords: str | None,
    run: list[str],
) -> tuple[list[dict], int]:
    ds = get_dataset(tenant_id, dataset_id)
    query = Document.select().where(Document.dataset_id == ds.id)
    if ids:
        query = query.where(Document.id.in_(ids))
    if name:
        query = query.where(Document.name == name)
    if keywords:
        query = query.where(Document.name.contains(keywords))
    if run:
        bad = [r for r in run if r not in RUN_STATES]
        if bad:
            raise ArgumentError(f"'run' {bad[0]!r} is not one of {', '.join(RUN_STATES)}")
        query = query.where(Document.run.in_(run))
    total = query.count()
    rows = query.order_by(*Document.listing_order(orderby, desc)).paginate(page, page_size)
    docs = [document_json(d) for d in rows]
    if ids and len(ids) == 1 and not docs and page == 1:
        raise NotFound(f"document {ids[0]!r} not found in dataset {dataset_id!r}")
    return docs, total


def update_document(tenant_id: str, dataset_id: str, document_id: str, body: dict) -> Document:
    """Rename, or change the parser settings of a document not being parsed."""
    doc = get_document(tenant_id, dataset_id, document_id)
    changes: dict[str, Any] = {}
    if "name" in body:
        name = _text(body, "name", MAX_DOC_NAME, required=True)
        try:
            kind = docparse.document_type(name)
        except docparse.UnsupportedFileType:
            kind = None
        if kind != doc.type:
            raise ArgumentError(f"'name': {name!r} must keep the file type of {doc.name!r} ({doc.type})")
        changes["name"] = name
    if "chunk_method" in body:
        changes["chunk_method"] = _check_chunk_method(body["chunk_method"])
    if "parser_config" in body:
        changes["parser_config"] = json.dumps(
            check_parser_config(body["parser_config"], _json_field(doc.parser_config, {}))
        )
    if ("parser_config" in changes or "chunk_method" in changes) and doc.run == "RUNNING":
        raise ArgumentError(f"document {document_id!r} is being parsed; cancel it before changing its parser")
    if "enabled" in body and body["enabled"] not in (0, 1, True, False):
        raise ArgumentError(f"'enabled' must be 0 or 1, got {body['enabled']!r}")
    if changes:
        changes["update_time"] = now_ms()
        with write_transaction():
            Document.update(changes).where(Document.id == doc.id).execute()
    return get_document(tenant_id, dataset_id, document_id)


def delete_documents(tenant_id: str, dataset_id: str, ids: Any, delete_all: bool = False) -> int:
    """Delete documents with their bytes, chunks and index entries; all named must exist."""
    ds = get_dataset(tenant_id, dataset_id)
    if delete_all:
        ids = [d.id for d in Document.select(Document.id).where(Document.dataset_id == ds.id)]
    elif ids is None:
        return 0
    else:
        ids = _check_document_ids(ds, ids, "ids")
    with write_transaction():
        _delete_document_rows(ids)
    return len(ids)


def _check_document_ids(ds: Dataset, ids: Any, name: str) -> list[str]:
    if isinstance(ids, str):
        ids = [ids]
    if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
        raise ArgumentError(f"{name!r} must be a list of document ids, got {ids!r}")
    ids = list(dict.fromkeys(ids))
    found = {
        d.id
        for d in Document.select(Document.id).where(Document.id.in_(ids) & (Document.dataset_id == ds.id))
    }
    missing = [i for i in ids if i not in found]
    if missing:
        raise NotFound(f"{name}: document {missing[0]!r} not found in dataset {ds.id!r}")
    return ids


def _delete_document_rows(doc_ids: list[str]) -> None:
    """Documents, their pieces, chunks and index entries (inside the caller's transaction)."""
    for start in range(0, len(doc_ids), 200):
        part = doc_ids[start : start + 200]
        delete_chunks_of(part)
        FilePiece.delete().where(FilePiece.file_id.in_(part)).execute()
        Document.delete().where(Document.id.in_(part)).execute()


def delete_chunks_of(doc_ids: Iterable[str], parsed_only: bool = False) -> None:
    """Every chunk of these documents and its index entry (in the caller's transaction)."""
    doc_ids = list(doc_ids)
    if not doc_ids:
        return
    cond = Chunk.document_id.in_(doc_ids)
    if parsed_only:
        cond &= Chunk.chunk_index.is_null(False)
    chunk_ids = [c.id for c in Chunk.select(Chunk.id).where(cond)]
    CHUNKS.remove(chunk_ids)
    Chunk.delete().where(cond).execute()


# ---------------------------------------------------------------------- chunks
def list_chunks(
    tenant_id: str, dataset_id: str, document_id: str, page: int, page_size: int, keywords: str, chunk_id: str
) -> dict:
    doc = get_document(tenant_id, dataset_id, document_id)
    query = Chunk.select().where(Chunk.document_id == doc.id)
    if chunk_id:
        query = query.where(Chunk.id == chunk_id)
    if keywords:
        query = query.where(Chunk.content.contains(keywords))
    total = query.count()
    rows = query.order_by(Chunk.chunk_index.is_null(), Chunk.chunk_index, Chunk.create_time, Chunk.id)
    chunks = [chunk_json(c, doc.name) for c in rows.paginate(page, page_size)]
    if chunk_id and not chunks:
        raise NotFound(f"chunk {chunk_id!r} not found in document {document_id!r}")
    return {"chunks": chunks, "doc": document_json(doc), "total": total}


def _keyword_list(body: dict, name: str) -> list[str] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ArgumentError(f"{name!r} must be a list of text, got {value!r}")
    return value


def _index_text(content: str, keywords: list[str], questions: list[str]) -> str:
    """What the full-text index holds for a chunk: its text, keywords and questions."""
    return "\n".join([content, *keywords, *questions])


def add_chunk(
    tenant_id: str, dataset_id: str, document_id: str, body: dict, limits: KnowledgeLimits, embed
) -> Chunk:  # noqa: ANN001
    """A chunk added by hand (indexed, and embedded when the dataset has a model).

    ``embed``: ``(dataset, [text]) -> [vector] | None`` (see :mod:`api.services.retrieval`).
    """
    doc = get_document(tenant_id, dataset_id, document_id)
    ds = get_dataset(tenant_id, dataset_id)
    content = _text(body, "content", 1_000_000, required=True)
    keywords = _keyword_list(body, "important_keywords") or []
    questions = _keyword_list(body, "questions") or []
    count = Chunk.select().where(Chunk.dataset_id == ds.id).count()
    if count + 1 > limits.max_chunks_per_dataset:
        raise TooLarge(
            f"dataset {ds.id!r} holds {count} chunks; the limit is {limits.max_chunks_per_dataset} "
            f"(datasets.max_chunks_per_dataset)"
        )
    vectors = embed(ds, [content])
    now = now_ms()
    with write_transaction():
        chunk = Chunk.create(
            id=new_id(),
            dataset_id=ds.id,
            document_id=doc.id,
            chunk_index=None,
            content=content,
            important_keywords=json.dumps(keywords, ensure_ascii=False),
            questions=json.dumps(questions, ensure_ascii=False),
            token_count=token_count(content),
            embedding=pack_vector(vectors[0]) if vectors else None,
            create_time=now,
            update_time=now,
        )
        CHUNKS.add(ds.id, [(chunk.id, _index_text(content, keywords, questions))])
        Document.update(chunk_count=Document.chunk_count + 1, update_time=now).where(
            Document.id == doc.id
        ).execute()
    return chunk


def update_chunk(
    tenant_id: str, dataset_id: str, document_id: str, chunk_id: str, body: dict, embed
) -> Chunk:  # noqa: ANN001
    doc = get_document(tenant_id, dataset_id, document_id)
    chunk = Chunk.get_or_none((Chunk.id == chunk_id) & (Chunk.document_id == doc.id))
    if chunk is None:
        raise NotFound(f"chunk {chunk_id!r} not found in document {document_id!r}")
    content = _text(body, "content", 1_000_000, required=False)
    if content is not None and not content:
        raise ArgumentError("'content' must not be empty")
    keywords = _keyword_list(body, "important_keywords")
    questions = _keyword_list(body, "questions")
    available = body.get("available")
    if available is not None and available not in (True, False, 0, 1):
        raise ArgumentError(f"'available' must be true or false, got {available!r}")
    changes: dict[str, Any] = {"update_time": now_ms()}
    if content is not None:
        changes["content"] = content
        changes["token_count"] = token_count(content)
        ds = get_dataset(tenant_id, dataset_id)
        vectors = embed(ds, [content])
        if vectors:
            changes["embedding"] = pack_vector(vectors[0])
    if keywords is not None:
        changes["important_keywords"] = json.dumps(keywords, ensure_ascii=False)
    if questions is not None:
        changes["questions"] = json.dumps(questions, ensure_ascii=False)
    if available is not None:
        changes["available"] = bool(available)
    with write_transaction():
        Chunk.update(changes).where(Chunk.id == chunk.id).execute()
        if content is not None or keywords is not None or questions is not None:
            fresh = Chunk.get_by_id(chunk.id)
            CHUNKS.remove([chunk.id])
            CHUNKS.add(
                chunk.dataset_id,
                [
                    (
                        chunk.id,
                        _index_text(
                            fresh.content,
                            _json_field(fresh.important_keywords, []),
                            _json_field(fresh.questions, []),
                        ),
                    )
                ],
            )
    return Chunk.get_by_id(chunk.id)


def delete_chunks(
    tenant_id: str, dataset_id: str, document_id: str, ids: Any, delete_all: bool = False
) -> int:
    doc = get_document(tenant_id, dataset_id, document_id)
    if delete_all:
        ids = [c.id for c in Chunk.select(Chunk.id).where(Chunk.document_id == doc.id)]
    elif ids is None:
        return 0
    else:
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ArgumentError(f"'chunk_ids' must be a list of chunk ids, got {ids!r}")
        found = {
            c.id for c in Chunk.select(Chunk.id).where(Chunk.id.in_(ids) & (Chunk.document_id == doc.id))
        }
        missing = [i for i in ids if i not in found]
        if missing:
            raise NotFound(f"chunk_ids: chunk {missing[0]!r} not found in document {document_id!r}")
    with write_transaction():
        CHUNKS.remove(ids)
        Chunk.delete().where(Chunk.id.in_(ids) & (Chunk.document_id == doc.id)).execute()
        Document.update(chunk_count=Document.chunk_count - len(ids)).where(Document.id == doc.id).execute()
    return len(ids)


def pack_vector(vector: list[float]) -> bytes:
    """A vector as packed float32."""
    return array.array("f", vector).tobytes()


def unpack_vector(data: bytes | None) -> list[float] | None:
    if not data:
        return None
    values = array.array("f")
    values.frombytes(bytes(data))
    return values.tolist()
