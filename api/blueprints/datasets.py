"""``/api/v1/datasets…`` and ``/api/v1/retrieval``: knowledge bases (RAGFlow's dataset API)."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, request
from flask.typing import ResponseReturnValue

from api.auth import require_api_token
from api.errors import ArgumentError
from api.http import flag, json_body, ok, order_args, page_args, tenant_id
from api.openapi import Body, spec
from api.services import datasets, parsing
from api.services.datasets import KnowledgeLimits
from api.services.retrieval import Retriever, embedder

bp = Blueprint("datasets", __name__, url_prefix="/api/v1")
bp.before_request(require_api_token)


Flag = bool | str | int | None


class DatasetBody(Body):
    """A knowledge base, as RAGFlow's dataset API takes it (``name`` is required to create one)."""

    name: str | None = None
    description: str | None = None
    avatar: str | None = None
    embedding_model: str | None = None
    chunk_method: str | None = None
    permission: str | None = None
    parser_config: dict | None = None


class IdsBody(Body):
    ids: list | None = None
    delete_all: Flag = None


class ChunkIdsBody(Body):
    chunk_ids: list | None = None
    delete_all: bool | str | int | None = None


class DocumentIdsBody(Body):
    document_ids: list | None = None


class DocumentBody(Body):
    name: str | None = None
    chunk_method: str | None = None
    parser_config: dict | None = None
    enabled: Flag = None


class ChunkBody(Body):
    content: str | None = None
    important_keywords: list | None = None
    questions: list | None = None
    available: Flag = None


class RetrievalBody(Body):
    """A search over datasets: ``question`` and ``dataset_ids`` (or ``document_ids``)."""

    question: str | None = None
    dataset_ids: list | str | None = None
    document_ids: list | str | None = None
    page: int | str | None = None
    page_size: int | str | None = None
    similarity_threshold: float | str | None = None
    vector_similarity_weight: float | str | None = None
    top_k: int | str | None = None
    keyword: Flag = None
    highlight: Flag = None


def _limits() -> KnowledgeLimits:
    return current_app.extensions["agentcanvas.knowledge_limits"]


def _llm_settings() -> dict:
    return (current_app.config.get("SETTINGS") or {}).get("llm") or {}


def _embed():  # noqa: ANN202
    return embedder(_llm_settings(), _limits().embedding_batch)


def _ids(body: dict, name: str = "ids") -> tuple[list | None, bool]:
    """``(ids, delete_all)``: ``{"ids": null}`` without ``delete_all`` means all (ragflow-sdk 0.22)."""
    ids = body.get(name)
    delete_all = flag(body.get("delete_all"), "delete_all")
    if ids is None and name in body and "delete_all" not in body:
        delete_all = True
    return ids, delete_all


# ---------------------------------------------------------------------- datasets
@bp.post("/datasets")
@spec.validate(json=DatasetBody, tags=["datasets"])
def create_dataset() -> ResponseReturnValue:
    return ok(datasets.dataset_json(datasets.create_dataset(tenant_id(), json_body())))


@bp.get("/datasets")
def list_datasets() -> ResponseReturnValue:
    page, page_size = page_args()
    orderby, desc = order_args(datasets.DATASET_ORDER, "create_time")
    rows, total = datasets.list_datasets(
        tenant_id(), page, page_size, orderby, desc, request.args.get("id"), request.args.get("name")
    )
    return ok(rows, total=total)


@bp.put("/datasets/<dataset_id>")
@spec.validate(json=DatasetBody, tags=["datasets"])
def update_dataset(dataset_id: str) -> ResponseReturnValue:
    return ok(datasets.dataset_json(datasets.update_dataset(tenant_id(), dataset_id, json_body())))


@bp.delete("/datasets")
@spec.validate(json=IdsBody, tags=["datasets"])
def delete_datasets() -> ResponseReturnValue:
    ids, delete_all = _ids(json_body(required=False))
    return ok({"success_count": datasets.delete_datasets(tenant_id(), ids, delete_all)})


# ---------------------------------------------------------------------- documents
@bp.post("/datasets/<dataset_id>/documents")
def upload_documents(dataset_id: str) -> ResponseReturnValue:
    limits = _limits()
    # The body may hold several whole files: up to the file limit times the files allowed.
    request.max_content_length = limits.max_file_bytes * limits.max_files_per_request + 1024 * 1024
    datasets.get_dataset(tenant_id(), dataset_id)
    if not request.content_type or not request.content_type.startswith("multipart/form-data"):
        raise ArgumentError("send the documents as multipart/form-data, field 'file'")
    files = [(f.filename or "", f.read(limits.max_file_bytes + 1)) for f in request.files.getlist("file")]
    docs = datasets.upload_documents(tenant_id(), dataset_id, files, limits)
    return ok([datasets.document_json(d) for d in docs])


@bp.get("/datasets/<dataset_id>/documents")
def list_documents(dataset_id: str) -> ResponseReturnValue:
    page, page_size = page_args()
    orderby, desc = order_args(datasets.DOCUMENT_ORDER, "create_time")
    ids = [i for i in request.args.getlist("ids") + request.args.getlist("id") if i]
    docs, total = datasets.list_documents(
        tenant_id(),
        dataset_id,
        page,
        page_size,
        orderby,
        desc,
        ids,
        request.args.get("name"),
        request.args.get("keywords"),
        [r for r in request.args.getlist("run") if r],
    )
    return ok({"docs": docs, "total": total})


@bp.get("/datasets/<dataset_id>/documents/<document_id>")
def download_document(dataset_id: str, document_id: str) -> ResponseReturnValue:
    doc = datasets.get_document(tenant_id(), dataset_id, document_id)
    data = datasets.document_bytes(doc.id)
    response = Response(data, mimetype="application/octet-stream")
    response.headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{_quote(doc.name)}"
    return response


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


@bp.route("/datasets/<dataset_id>/documents/<document_id>", methods=["PUT", "PATCH"])
@spec.validate(json=DocumentBody, tags=["datasets"])
def update_document(dataset_id: str, document_id: str) -> ResponseReturnValue:
    doc = datasets.update_document(tenant_id(), dataset_id, document_id, json_body())
    return ok(datasets.document_json(doc))


@bp.delete("/datasets/<dataset_id>/documents")
@spec.validate(json=IdsBody, tags=["datasets"])
def delete_documents(dataset_id: str) -> ResponseReturnValue:
    ids, delete_all = _ids(json_body(required=False))
    return ok({"success_count": datasets.delete_documents(tenant_id(), dataset_id, ids, delete_all)})


# ---------------------------------------------------------------------- parsing
@bp.post("/datasets/<dataset_id>/chunks")
@spec.validate(json=DocumentIdsBody, tags=["datasets"])
def parse_documents(dataset_id: str) -> ResponseReturnValue:
    body = json_body()
    parsing.start_parsing(tenant_id(), dataset_id, body.get("document_ids"))
    parsing.parse_workers_for(current_app).wake()
    return ok(None)


@bp.delete("/datasets/<dataset_id>/chunks")
@spec.validate(json=DocumentIdsBody, tags=["datasets"])
def cancel_parsing(dataset_id: str) -> ResponseReturnValue:
    body = json_body()
    parsing.cancel_parsing(tenant_id(), dataset_id, body.get("document_ids"))
    return ok(None)


# ---------------------------------------------------------------------- chunks
@bp.get("/datasets/<dataset_id>/documents/<document_id>/chunks")
def list_chunks(dataset_id: str, document_id: str) -> ResponseReturnValue:
    page, page_size = page_args()
    return ok(
        datasets.list_chunks(
            tenant_id(),
            dataset_id,
            document_id,
            page,
            page_size,
            request.args.get("keywords") or "",
            request.args.get("id") or "",
        )
    )


@bp.post("/datasets/<dataset_id>/documents/<document_id>/chunks")
@spec.validate(json=ChunkBody, tags=["datasets"])
def add_chunk(dataset_id: str, document_id: str) -> ResponseReturnValue:
    chunk = datasets.add_chunk(tenant_id(), dataset_id, document_id, json_body(), _limits(), _embed())
    doc = datasets.get_document(tenant_id(), dataset_id, document_id)
    return ok({"chunk": datasets.chunk_json(chunk, doc.name)})


@bp.route("/datasets/<dataset_id>/documents/<document_id>/chunks/<chunk_id>", methods=["PUT", "PATCH"])
@spec.validate(json=ChunkBody, tags=["datasets"])
def update_chunk(dataset_id: str, document_id: str, chunk_id: str) -> ResponseReturnValue:
    chunk = datasets.update_chunk(tenant_id(), dataset_id, document_id, chunk_id, json_body(), _embed())
    doc = datasets.get_document(tenant_id(), dataset_id, document_id)
    return ok(datasets.chunk_json(chunk, doc.name))


@bp.delete("/datasets/<dataset_id>/documents/<document_id>/chunks")
@spec.validate(json=ChunkIdsBody, tags=["datasets"])
def delete_chunks(dataset_id: str, document_id: str) -> ResponseReturnValue:
    body = json_body(required=False)
    ids, delete_all = _ids(body, "chunk_ids")
    removed = datasets.delete_chunks(tenant_id(), dataset_id, document_id, ids, delete_all)
    return ok({"success_count": removed})


# ---------------------------------------------------------------------- search
@bp.post("/retrieval")
@spec.validate(json=RetrievalBody, tags=["retrieval"])
def retrieval() -> ResponseReturnValue:
    retriever = Retriever(
        tenant_id(), _llm_settings(), max_page_size=int(current_app.config["PAGE_SIZE"]) * 10
    )
    return ok(retriever.search_request(json_body()))
