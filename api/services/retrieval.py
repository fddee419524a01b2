"""Searching datasets (``POST /retrieval`` and the Retrieval component), and embeddings.

A search scores each chunk by its term similarity (BM25 from the full-text index,
scaled to [0, 1), see :mod:`api.db.fulltext`) and, when the datasets have an
``embedding_model``, by the cosine of its vector with the question's; the two are
mixed as RAGFlow does: ``similarity = (1 - w) * term + w * vector`` with
``w = vector_similarity_weight``. Without embeddings the similarity is the term
similarity. Chunks under ``similarity_threshold`` are dropped.

Vectors are compared for the chunks the full-text index found, and, when the
datasets hold at most :data:`VECTOR_SCAN_LIMIT` chunks, for every chunk (so a
question with no word in common can still find its answer); past that, vector
search only re-ranks the term matches.

:class:`Retriever` is what the canvas gets as ``services["retriever"]``: bound to
one tenant, so the Retrieval component can never read another tenant's datasets.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from agent.component.retrieval import number_in_range
from agent.deadline import Deadline
from agent.errors import LLMError
from agent.llm.client import ChatClient
from agent.llm.config import resolve_model
from agent.search_tokens import query_terms
from api.db import Chunk, Dataset, Document, db
from api.errors import ApiError, ArgumentError, NotFound
from api.services import datasets
from api.services.datasets import CHUNKS

VECTOR_SCAN_LIMIT = 5000


class EmbeddingError(ApiError):
    """The embedding model could not be reached or gave no vectors."""

    status = 502


def embedder(llm_settings: dict | None, batch: int = 32):  # noqa: ANN201 - a callable
    """``embed(dataset, texts, deadline=None) -> vectors | None``: ``None`` when the dataset
    has no model; a turn passes its deadline, so the wait obeys the turn's budget and cancel."""

    def embed(ds: Dataset, texts: list[str], deadline: Deadline | None = None) -> list[list[float]] | None:
        if not ds.embedding_model or not texts:
            return None
        config = resolve_model(ds.embedding_model, llm_settings or {})
        extra = {} if deadline is None else {"deadline": deadline, "sleep": deadline.sleep}
        client = ChatClient(config, who=f"dataset {ds.name!r}", **extra)
        vectors: list[list[float]] = []
        for start in range(0, len(texts), batch):
            vectors.extend(client.embed(texts[start : start + batch]))
        return vectors

    return embed


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    try:
        return number_in_range(value, repr(name), low, high)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None


def _whole(body: dict, name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ArgumentError(f"{name!r} must be a whole number from {low} to {high}, got {value!r}")
    return value


class Retriever:
    """Searches the datasets of one tenant (see the module docstring)."""

    def __init__(self, tenant_id: str, llm_settings: dict | None = None, max_page_size: int = 1024):
        self.tenant_id = tenant_id
        self.embed = embedder(llm_settings)
        self.max_page_size = max_page_size

    def resolve(self, names_or_ids: list[str]) -> list[str]:
        """Dataset ids for ids or names of this tenant's datasets; a missing one is :class:`NotFound`."""
        out = []
        for value in names_or_ids:
            row = Dataset.get_or_none(
                (Dataset.tenant_id == self.tenant_id) & ((Dataset.id == value) | (Dataset.name == value))
            )
            if row is None:
                raise NotFound(f"dataset {value!r} not found")
            out.append(row.id)
        return list(dict.fromkeys(out))

    def retrieve(
        self,
        kb_ids: list[str],
        query: str,
        *,
        top_n: int = 8,
        similarity_threshold: float = 0.2,
        vector_similarity_weight: float = 0.3,
        top_k: int = 1024,
        deadline: Deadline | None = None,
    ) -> dict:
        """What the Retrieval component calls: ids or names of this tenant's datasets."""
        return self.search(
            self.resolve(kb_ids),
            query,
            page_size=top_n,
            similarity_threshold=similarity_threshold,
            vector_similarity_weight=vector_similarity_weight,
            top_k=top_k,
            deadline=deadline,
        )

    def search_memory(
        self, memory_ids: list[str], query: str, *, top_n: int = 8, similarity_threshold: float = 0.2
    ) -> list[dict]:
        """What Retrieval with ``retrieval_from: "memory"`` calls: this tenant's Memories'
        messages for ``query`` (:func:`api.services.memories.search_messages`)."""
        from api.services import memories

        return memories.search_messages(self.tenant_id, memory_ids, query, top_n, similarity_threshold)

    def search_request(self, body: dict) -> dict:
        """``POST /retrieval``: check the body as RAGFlow's API takes it, then :meth:`search`."""
        for name, what in (
            ("rerank_id", "a rerank model"),
            ("use_kg", "knowledge graphs"),
            ("toc_enhance", "table-of-contents search"),
            ("cross_languages", "query translation"),
            ("metadata_condition", "document metadata filters"),
        ):
            if body.get(name):
                raise ArgumentError(f"{name!r} ({what}) is not supported by this server; leave it empty")
        question = body.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ArgumentError("'question' is required: the text to search for")
        ids = body.get("dataset_ids")
        if not ids:
            raise ArgumentError("'dataset_ids' is required: a list of dataset ids")
        dataset_ids = datasets.check_dataset_ids(self.tenant_id, ids)
        document_ids = body.get("document_ids") or []
        if not isinstance(document_ids, list) or not all(isinstance(d, str) for d in document_ids):
            raise ArgumentError(f"'document_ids' must be a list of document ids, got {document_ids!r}")
        if document_ids:
            known = {
                d.id
                for d in Document.select(Document.id).where(
                    Document.id.in_(document_ids) & Document.dataset_id.in_(dataset_ids)
                )
            }
            missing = [d for d in document_ids if d not in known]
            if missing:
                raise NotFound(f"document_ids: document {missing[0]!r} not found in the datasets given")
        return self.search(
            dataset_ids,
            question,
            document_ids=document_ids,
            page=_whole(body, "page", 1, 1, 10**6),
            page_size=_whole(body, "page_size", 30, 1, self.max_page_size),
            similarity_threshold=_number(body, "similarity_threshold", 0.2, 0.0, 1.0),
            vector_similarity_weight=_number(body, "vector_similarity_weight", 0.3, 0.0, 1.0),
            top_k=_whole(body, "top_k", 1024, 1, 100_000),
            keyword=bool(body.get("keyword")),
            highlight=bool(body.get("highlight")),
        )

    def search(
        self,
        dataset_ids: list[str],
        question: str,
        *,
        document_ids: list[str] | None = None,
        page: int = 1,
        page_size: int = 30,
        similarity_threshold: float = 0.2,
        vector_similarity_weight: float = 0.3,
        top_k: int = 1024,
        keyword: bool = False,
        highlight: bool = False,
        deadline: Deadline | None = None,
    ) -> dict:
        """``{chunks, doc_aggs, total}`` for ``question`` in this tenant's ``dataset_ids``.

        ``deadline``: a turn's; the question's embedding waits no longer than it allows."""
        rows = list(
            Dataset.select().where(Dataset.id.in_(dataset_ids) & (Dataset.tenant_id == self.tenant_id))
        )
        if len(rows) != len(set(dataset_ids)):
            found = {d.id for d in rows}
            raise NotFound(f"dataset {next(i for i in dataset_ids if i not in found)!r} not found")
        models = {d.embedding_model for d in rows}
        if len(models) > 1:
            raise ArgumentError(
                "the datasets use different embedding models "
                f"({', '.join(sorted(repr(m) for m in models))}); search them separately"
            )
        model_ds = next((d for d in rows if d.embedding_model), None)
        hits = CHUNKS.search(dataset_ids, question, limit=top_k)
        term = {h.item_id: h.term_similarity for h in hits}
        bm25_score = {h.item_id: h.score for h in hits}
        vector: dict[str, float] = {}
        weight = vector_similarity_weight if model_ds is not None else 0.0
        if model_ds is not None:
            try:
                query_vector = self.embed(model_ds, [question], deadline)[0]
            except LLMError as exc:
                raise EmbeddingError(f"the question could not be embedded: {exc}") from None
            scan = Chunk.select(Chunk.id, Chunk.embedding).where(Chunk.dataset_id.in_(dataset_ids))
            total = scan.count()
            if total > VECTOR_SCAN_LIMIT:
                scan = scan.where(Chunk.id.in_(list(term)))
            for row in scan:
                vec = datasets.unpack_vector(row.embedding)
                if vec is not None:
                    vector[row.id] = max(0.0, _cosine(query_vector, vec))
        scores = {}
        for cid in set(term) | set(vector):
            scores[cid] = (1 - weight) * term.get(cid, 0.0) + weight * vector.get(cid, 0.0)
        chosen = [cid for cid, s in scores.items() if s >= similarity_threshold]
        # Every match counts (total, doc_aggs), but only the page's rows are read whole.
        owner = _available_documents(chosen)
        if document_ids:
            wanted = set(document_ids)
            owner = {k: d for k, d in owner.items() if d in wanted}
        # Equal similarities (term similarity is capped at 1) keep BM25's order.
        ranked = sorted(owner, key=lambda cid: (-scores[cid], -bm25_score.get(cid, 0.0), cid))
        page_ids = ranked[(page - 1) * page_size : page * page_size]
        chunks = {c.id: c for c in Chunk.select().where(Chunk.id.in_(page_ids))} if page_ids else {}
        names = {
            d.id: d.name
            for d in Document.select(Document.id, Document.name).where(
                Document.id.in_(list(set(owner.values())))
            )
        }
        counts = Counter(owner[cid] for cid in ranked)
        doc_aggs = [
            {"doc_id": doc_id, "doc_name": names.get(doc_id, ""), "count": n}
            for doc_id, n in counts.most_common()
        ]
        terms = query_terms(question)
        out = []
        for cid in page_ids:
            c = chunks[cid]
            item = {
                "id": c.id,
                "content": c.content,
                "content_ltks": "",
                "document_id": c.document_id,
                "document_keyword": names.get(c.document_id, ""),
                "document_name": names.get(c.document_id, ""),
                "docnm_kwd": names.get(c.document_id, ""),
                "dataset_id": c.dataset_id,
                "kb_id": c.dataset_id,
                "image_id": "",
                "important_keywords": datasets._json_field(c.important_keywords, []),
                "positions": [],
                "similarity": round(scores[cid], 6),
                "term_similarity": round(term.get(cid, 0.0), 6),
                "vector_similarity": round(vector.get(cid, 0.0), 6),
            }
            if highlight:
                item["highlight"] = highlight_terms(c.content, terms)
            out.append(item)
        return {"chunks": out, "doc_aggs": doc_aggs, "total": len(ranked)}


def _available_documents(ids: list[str]) -> dict[str, str]:
    """``{chunk id: document id}`` of the chunks among ``ids`` that are available."""
    out: dict[str, str] = {}
    for start in range(0, len(ids), 500):
        part = ids[start : start + 500]
        marks = ", ".join([db.obj.param] * len(part))
        cursor = db.execute_sql(
            f"SELECT id, document_id FROM chunk WHERE available = {db.obj.param} AND id IN ({marks})",
            [True, *part],
        )
        out.update((row[0], row[1]) for row in cursor.fetchall())
    return out


def highlight_terms(text: str, terms: list[str]) -> str:
    """``text`` with each query word wrapped in ``<em>`` (RAGFlow's ``highlight``)."""
    words = sorted({t for t in terms if t}, key=len, reverse=True)
    if not words:
        return text
    pattern = re.compile("|".join(re.escape(w) for w in words), re.IGNORECASE)
    return pattern.sub(lambda m: f"<em>{m.group(0)}</em>", text)
