"""Google: Google search through SerpApi (RAGFlow's tool).

Params (RAGFlow's): ``q`` (default ``{sys.query}``), ``start`` (0), ``num`` (6) —
what a model may set — and ``country`` (``gl``, e.g. ``us``), ``language`` (``hl``,
e.g. ``en``), ``api_key`` (SerpApi's). Outputs ``formalized_content`` and ``json``
(SerpApi's ``organic_results``).

The API: ``GET {base_url}/search.json?engine=google&q=…&api_key=…``
(https://serpapi.com/search-api); an invalid key, a spent quota or no results come
back as ``{"error": …}``, which fails the component with SerpApi's words. RAGFlow
refuses to load a Google tool without a key; here the key may also come from the
settings (``tools.google.api_key``), so a missing one is a run-time error.
"""

from __future__ import annotations

import re
from typing import Any

from agent.component import register
from agent.component.tool import ToolComponent, ToolParam, require_text, results_output


class GoogleParam(ToolParam):
    tool_inputs = {
        "q": {
            "type": "string",
            "description": "The search keywords: the most important words of the request.",
            "default": "{sys.query}",
            "required": True,
        },
        "start": {
            "type": "integer",
            "description": "Result offset, for paging (0, 10, 20...).",
            "default": 0,
        },
        "num": {"type": "integer", "description": "How many results (default 6).", "default": 6},
    }

    def __init__(self) -> None:
        super().__init__()
        self.country = "cn"
        self.language = "en"

    def check(self) -> None:
        for name in ("country", "language"):
            value = getattr(self, name)
            if not isinstance(value, str) or not re.fullmatch(
                r"[A-Za-z]{2}([-_][A-Za-z]{2,5})?|xx-[a-z]+", value
            ):
                raise ValueError(f"{name} must be a code like 'us' or 'en', got {value!r}")
        for name in ("start", "num"):
            value = getattr(self, name)
            if isinstance(value, str) and value.strip().isdigit():
                setattr(self, name, int(value))
            self.check_nonnegative_int(name)


@register
class Google(ToolComponent):
    component_name = "Google"
    param_class = GoogleParam
    tool_name = "google_search"
    tool_description = "Search the world's information with Google: web pages and more."
    settings_name = "google"
    default_base_url = "https://serpapi.com"

    def run_tool(self, q: Any = None, start: Any = None, num: Any = None) -> None:
        q = require_text(self, "q", q)
        if not q:
            self.set_output("formalized_content", "")
            return
        answer = self.call_json(
            "GET",
            "/search.json",
            query={
                "engine": "google",
                "q": q,
                "google_domain": "google.com",
                "gl": self._param.country,
                "hl": self._param.language,
                "start": _whole(start, self._param.start),
                "num": _whole(num, self._param.num),
                "api_key": self.api_key(),
            },
        )
        if not isinstance(answer, dict) or "organic_results" not in answer:
            error = answer.get("error") if isinstance(answer, dict) else None
            raise self.fail(f"SerpApi: {error or 'the answer has no organic_results'}", retryable=False)
        results = answer["organic_results"]
        chunks = [
            {
                "title": r.get("title", ""),
                "url": r.get("link", ""),
                "content": ((r.get("about_this_result") or {}).get("source") or {}).get("description")
                or r.get("snippet", ""),
            }
            for r in results
            if isinstance(r, dict)
        ]
        results_output(self, chunks, results)


def _whole(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return int(default)
