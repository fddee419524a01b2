"""TavilySearch and TavilyExtract: Tavily's search and extract APIs (RAGFlow's tools).

TavilySearch params (RAGFlow's): ``query`` (default ``{sys.query}``), ``topic``
(``general``/``news``), ``include_domains``, ``exclude_domains`` — these four are what
a model may set — and ``search_depth`` (``basic``/``advanced``), ``max_results``
(1–20), ``days``, ``include_answer``, ``api_key``. Outputs ``formalized_content``
(the results as text for a prompt) and ``json`` (Tavily's ``results``).

TavilyExtract params: ``urls`` (a list, or text of comma-separated URLs),
``extract_depth`` (``basic``/``advanced``), ``format`` (``markdown``/``text``),
``api_key``. Output ``json`` (Tavily's ``results``: ``url``, ``raw_content``).

The API: ``POST {base_url}/search`` and ``/extract`` with a JSON body and
``Authorization: Bearer <key>`` (https://docs.tavily.com). Settings ``tools.tavily.*``
(``base_url``, ``api_key``...; see :mod:`agent.component.tool`).
"""

from __future__ import annotations

import json
from typing import Any

from agent.component import register
from agent.component.tool import ToolComponent, ToolParam, require_text, results_output

_DOMAINS = {"type": "array", "items": {"type": "string"}, "default": []}


class TavilySearchParam(ToolParam):
    tool_inputs = {
        "query": {
            "type": "string",
            "description": "The search keywords: the most important words of the request (fewer than 5).",
            "default": "{sys.query}",
            "required": True,
        },
        "topic": {
            "type": "string",
            "description": "general for broad searches, news for current events.",
            "enum": ["general", "news"],
            "default": "general",
        },
        "include_domains": {**_DOMAINS, "description": "Only results from these domains."},
        "exclude_domains": {**_DOMAINS, "description": "No results from these domains."},
    }

    def __init__(self) -> None:
        super().__init__()
        self.search_depth = "basic"
        self.max_results: Any = 6
        self.days: Any = 14
        self.include_answer = False
        self.include_raw_content = False
        self.include_images = False
        self.include_image_descriptions = False

    def check(self) -> None:
        self.check_choice("topic", ("general", "news"))
        self.check_choice("search_depth", ("basic", "advanced"))
        self.check_positive_int("max_results", maximum=20)
        self.check_positive_int("days")


@register
class TavilySearch(ToolComponent):
    component_name = "TavilySearch"
    param_class = TavilySearchParam
    tool_name = "tavily_search"
    tool_description = (
        "Tavily is a search engine optimized for LLMs. Start with a specific query about one aspect, "
        "fewer than 5 keywords; broaden if needed; cross-reference several sources."
    )
    settings_name = "tavily"
    default_base_url = "https://api.tavily.com"

    def run_tool(
        self, query: Any = None, topic: Any = None, include_domains: Any = None, exclude_domains: Any = None
    ) -> None:
        query = require_text(self, "query", query)
        if not query:
            self.set_output("formalized_content", "")
            return
        p = self._param
        body = {
            "query": query,
            "topic": topic if topic in ("general", "news") else p.topic,
            "search_depth": p.search_depth,
            "max_results": p.max_results,
            "days": p.days,
            "include_answer": bool(p.include_answer),
            "include_raw_content": False,  # as RAGFlow: the snippets are enough for a prompt
            "include_images": False,
            "include_domains": _domains(include_domains),
            "exclude_domains": _domains(exclude_domains),
        }
        answer = self.call_json(
            "POST", "/search", body=body, headers={"Authorization": f"Bearer {self.api_key()}"}
        )
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list):
            raise self.fail("Tavily's answer has no 'results' list")
        chunks = [
            {
                "title": r.get("title"),
                "url": r.get("url"),
                "content": r.get("raw_content") or r.get("content"),
            }
            for r in results
            if isinstance(r, dict)
        ]
        results_output(self, chunks, results)


def _domains(value: Any) -> list[str]:
    if isinstance(value, str):
        return [d.strip() for d in value.split(",") if d.strip()]
    return [str(d) for d in value] if isinstance(value, list) else []


class TavilyExtractParam(ToolParam):
    tool_inputs = {
        "urls": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The URLs to extract content from.",
            "default": "",
            "required": True,
        },
        "extract_depth": {
            "type": "string",
            "description": "basic, or advanced for tables and embedded content (slower).",
            "enum": ["basic", "advanced"],
            "default": "basic",
        },
        "format": {
            "type": "string",
            "description": "markdown or text.",
            "enum": ["markdown", "text"],
            "default": "markdown",
        },
    }

    def check(self) -> None:
        self.check_choice("extract_depth", ("basic", "advanced"))
        self.check_choice("format", ("markdown", "text"))


@register
class TavilyExtract(ToolComponent):
    component_name = "TavilyExtract"
    param_class = TavilyExtractParam
    tool_name = "tavily_extract"
    tool_description = "Extract web page content from one or more URLs using Tavily Extract."
    settings_name = "tavily"
    default_base_url = "https://api.tavily.com"

    def run_tool(self, urls: Any = None, extract_depth: Any = None, format: Any = None) -> None:  # noqa: A002 - RAGFlow's name
        urls = _domains(urls)
        if not urls:
            raise self.fail("urls is empty; give one or more URLs to extract", retryable=False)
        body = {
            "urls": urls,
            "extract_depth": extract_depth
            if extract_depth in ("basic", "advanced")
            else self._param.extract_depth,
            "format": format if format in ("markdown", "text") else self._param.format,
            "include_images": False,
        }
        answer = self.call_json(
            "POST", "/extract", body=body, headers={"Authorization": f"Bearer {self.api_key()}"}
        )
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list):
            raise self.fail("Tavily's answer has no 'results' list")
        self.set_output("json", results)
        failed = answer.get("failed_results") or []
        if failed:
            self.set_output("failed_results", failed)

    def tool_result(self) -> str | None:
        return json.dumps(self.outputs.get("json"), ensure_ascii=False)
