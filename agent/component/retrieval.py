"""Retrieval: find the chunks of the tenant's datasets that answer a query.

Params (RAGFlow's): ``kb_ids`` (``dataset_ids`` is accepted as a synonym) — dataset
ids, or references (``{begin@kb}`` or bare ``begin@kb``) whose value is a dataset id
or name, or a list of them —; ``query`` (a template, or a bare reference; default
``{sys.query}``); ``similarity_threshold`` (0.2); ``keywords_similarity_weight``
(0.5: the weight of the term score, so the vector weight is ``1 -`` it); ``top_n``
(8 chunks); ``top_k`` (1024 candidates); ``empty_response`` (the output when
nothing is found). ``rerank_id``, ``use_kg``, ``toc_enhance``, ``cross_languages``,
and ``meta_data_filter`` are refused at load time with a clear error: this runtime
does not do them. An empty ``kb_ids`` (as RAGFlow's templates ship) loads with a
warning and finds nothing until a dataset is set. ``retrieval_from: "memory"`` with
``memory_ids`` searches RAGFlow Memories of the tenant instead ("retrieve from
memory", :mod:`api.services.memories`): the messages found, best first, are the
outputs (no citations).

Outputs: ``formalized_content`` (the chunks as knowledge blocks for a prompt, each
starting ``ID: n``, the number an answer cites as ``[ID:n]``) and ``json`` (the
chunk list). The chunks are added to the turn's references (see
:meth:`agent.canvas.Canvas.add_references`), which ``cite`` turns into the
``reference`` of ``message_end``.

Searching is the host's: ``canvas.services["retriever"]`` must have
``retrieve(kb_ids, query, top_n=, similarity_threshold=, vector_similarity_weight=,
top_k=, deadline=) -> {"chunks", "doc_aggs"}`` — ``deadline`` is the turn's
(:mod:`agent.deadline`), which every wait of the search obeys — and see only the
datasets of the agent's tenant (the API server gives one; a bare ``Canvas`` has none
and says so).
Usable as a component and as an Agent tool (the model passes ``query``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.errors import Cancelled, LimitError
from agent.refs import parse_ref, to_text

DEFAULT_DESCRIPTION = "Search the knowledge bases (datasets) for passages relevant to the query."


def number_in_range(value: Any, name: str, low: float, high: float) -> float:
    """``value`` (a number, or text of one) as a float within ``[low, high]``.

    Raises:
        ValueError: naming ``name`` and the range. Shared by the component's params and
            the ``/retrieval`` route, which take the same thresholds and weights.
    """
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{name} must be a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


class RetrievalParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.kb_ids: Any = []
        self.dataset_ids: Any = []
        self.query: Any = "{sys.query}"
        self.similarity_threshold: Any = 0.2
        self.keywords_similarity_weight: Any = 0.5
        self.top_n: Any = 8
        self.top_k: Any = 1024
        self.empty_response: Any = ""
        self.rerank_id: Any = ""
        self.use_kg: Any = False
        self.toc_enhance: Any = False
        self.cross_languages: Any = []
        self.meta_data_filter: Any = {}
        self.retrieval_from: Any = "dataset"
        self.memory_ids: Any = []

    def check(self) -> None:
        ids = self.dataset_ids or self.kb_ids or []
        if isinstance(ids, str):
            ids = [ids]
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise ValueError(f"kb_ids must be a list of dataset ids or references, got {ids!r}")
        self.kb_ids = ids
        if self.query is None:
            self.query = "{sys.query}"
        if not isinstance(self.query, str):
            raise ValueError(f"query must be text or a reference, got {self.query!r}")
        self.similarity_threshold = number_in_range(self.similarity_threshold, "similarity_threshold", 0, 1)
        self.keywords_similarity_weight = number_in_range(
            self.keywords_similarity_weight, "keywords_similarity_weight", 0, 1
        )
        for name, high in (("top_n", 1024), ("top_k", 100_000)):
            value = getattr(self, name)
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise ValueError(f"{name} must be a whole number from 1 to {high}, got {value!r}")
            setattr(self, name, value)
        if self.empty_response is None:
            self.empty_response = ""
        unsupported = [
            (self.rerank_id, "rerank_id (a rerank model)"),
            (self.use_kg, "use_kg (knowledge graphs)"),
            (self.toc_enhance, "toc_enhance (table-of-contents search)"),
            (self.cross_languages, "cross_languages (query translation)"),
            (self.meta_data_filter, "meta_data_filter (document metadata filters)"),
        ]
        for value, what in unsupported:
            if value:
                raise ValueError(f"{what} is not supported by this runtime; remove it or set it empty")
        if self.memory_ids is None:
            self.memory_ids = []
        if not isinstance(self.memory_ids, list) or not all(
            isinstance(m, str) and m for m in self.memory_ids
        ):
            raise ValueError(f"memory_ids must be a list of Memory ids, got {self.memory_ids!r}")
        if self.retrieval_from == "memory":
            if not self.memory_ids:
                raise ValueError("retrieval_from 'memory' needs memory_ids: the Memories to search")
        elif self.retrieval_from not in (None, "", "dataset"):
            raise ValueError(
                f"retrieval_from {self.retrieval_from!r} is not supported; Retrieval searches datasets ('dataset')"
            )


@register
class Retrieval(ComponentBase):
    component_name = "Retrieval"
    param_class = RetrievalParam
    bare_ref_params = ("kb_ids", "query")

    def __init__(self, canvas: Any, cpn_id: str, param: RetrievalParam, entry: dict):
        super().__init__(canvas, cpn_id, param, entry)
        if not param.kb_ids and param.retrieval_from != "memory":
            canvas.warnings.append(f"{cpn_id}: kb_ids is empty; it finds nothing until a dataset is set")
        self._formalized = ""

    def literal_dataset_ids(self) -> list[str]:
        """The ``kb_ids`` written as ids (not references): checked when an agent is saved."""
        return [i for i in self._param.kb_ids if parse_ref(i) is None]

    def _dataset_ids(self) -> list[str]:
        out: list[str] = []
        for item in self._param.kb_ids:
            if parse_ref(item) is None:
                out.append(item)
                continue
            value = self.get_value(item)
            for v in value if isinstance(value, list) else [value]:
                if v not in (None, ""):
                    out.append(to_text(v))
        return list(dict.fromkeys(out))

    def _query(self, kwargs: dict) -> str:
        if kwargs.get("query"):
            return to_text(kwargs["query"])
        query = self._param.query
        if "{" not in query and parse_ref(query) is not None:
            return to_text(self.get_value(query))
        return self.render(query)

    def _invoke(self, **kwargs: Any) -> Iterator[str] | None:
        query = self._query(kwargs).strip()
        query = re.sub(r"^user[:：\s]*", "", query, flags=re.IGNORECASE)
        self.inputs_seen = {"query": query}
        empty = to_text(self._param.empty_response or "")
        self._formalized = empty
        self.set_output("formalized_content", empty)
        self.set_output("json", [])
        from_memory = self._param.retrieval_from == "memory"
        ids = self._param.memory_ids if from_memory else self._dataset_ids()
        if not query or not ids:
            return None
        retriever = self._canvas.services.get("retriever")
        if retriever is None:
            raise self.fail(
                "no knowledge bases here: Retrieval needs the agentcanvas server (its datasets); "
                "a Canvas run alone has none",
                retryable=False,
            )
        if from_memory:
            return self._from_memory(retriever, query)
        try:
            found = retriever.retrieve(
                ids,
                query,
                top_n=self._param.top_n,
                similarity_threshold=self._param.similarity_threshold,
                vector_similarity_weight=1 - self._param.keywords_similarity_weight,
                top_k=self._param.top_k,
                deadline=self._canvas.deadline,
            )
        except (Cancelled, LimitError):
            raise
        except Exception as e:  # noqa: BLE001 - the host's error, with its own message
            raise self.fail(str(e) or type(e).__name__, retryable=False) from None
        self._canvas.deadline.check()
        chunks = list(found.get("chunks") or [])
        if not chunks:
            return None
        numbers = self._canvas.add_references(chunks)
        self._formalized = knowledge_blocks(chunks, numbers)
        self.set_output("formalized_content", self._formalized)
        self.set_output("json", chunks)
        return None

    def _from_memory(self, retriever: Any, query: str) -> None:
        """Search the Memories: the messages found are the outputs, best first."""
        try:
            messages = retriever.search_memory(
                self._param.memory_ids,
                query,
                top_n=self._param.top_n,
                similarity_threshold=self._param.similarity_threshold,
            )
        except (Cancelled, LimitError):
            raise
        except Exception as e:  # noqa: BLE001 - the host's error, with its own message
            raise self.fail(str(e) or type(e).__name__, retryable=False) from None
        if messages:
            self._formalized = "\n\n".join(f"Memory ({m['message_type']}): {m['content']}" for m in messages)
            self.set_output("formalized_content", self._formalized)
            self.set_output("json", messages)
        return None

    # -- as a tool ----------------------------------------------------------------------
    def tool_meta(self) -> dict:
        return {
            "description": self._param.description or DEFAULT_DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {
                        "type": "string",
                        "description": "The keywords to search for: the important words of the request, "
                        "with synonyms.",
                    }
                },
                "required": ["query"],
            },
        }

    def tool_result(self) -> str:
        """What the model reads back: the knowledge blocks (or the empty response)."""
        return self._formalized or "No relevant passage was found in the knowledge base."


def knowledge_blocks(chunks: list[dict], numbers: list[int]) -> str:
    """The chunks as text for a prompt, each block headed ``ID: n`` (RAGFlow's layout)."""
    blocks = []
    for chunk, n in zip(chunks, numbers, strict=True):
        title = re.sub(r"\s+", " ", str(chunk.get("document_name") or chunk.get("docnm_kwd") or ""))
        block = f"ID: {n}"
        if title:
            block += f"\n├── Title: {title}"
        block += f"\n└── Content:\n{chunk.get('content') or ''}"
        blocks.append(block)
    return "\n\n".join(blocks)


def dataset_ids_in(canvas: Any) -> list[tuple[str, str]]:
    """``(component id, dataset id)`` for every literal ``kb_ids`` entry of a canvas:
    Retrieval components and Retrieval tools at any depth (an Agent's tools, the tools
    of an Agent used as a tool, ...)."""
    out: list[tuple[str, str]] = []

    def walk(cid: str, cpn: Any) -> None:
        if isinstance(cpn, Retrieval):
            out.extend((cid, i) for i in cpn.literal_dataset_ids())
        for tool in (getattr(cpn, "_tools", None) or {}).values():
            walk(tool.id, tool)

    for cid, cpn in canvas.components.items():
        walk(cid, cpn)
    return out
