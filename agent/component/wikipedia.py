"""Wikipedia: search Wikipedia and read the pages' introductions (RAGFlow's tool).

Params (RAGFlow's): ``query`` (default ``{sys.query}``), ``top_n`` (10), ``language``
(``en``; a Wikipedia language code). Output ``formalized_content`` (and ``json``: the
pages as ``{title, url, summary}``).

The API: MediaWiki's ``GET {base_url}/w/api.php`` with ``action=query``,
``generator=search`` and ``prop=extracts|info`` — one call for the search and the
pages' plain-text introductions (https://www.mediawiki.org/wiki/API:Search,
API:Extracts). ``base_url`` defaults to ``https://{language}.wikipedia.org``; a
configured one may hold ``{language}`` too. Settings ``tools.wikipedia.*``.
"""

from __future__ import annotations

import re
from typing import Any

from agent.component import register
from agent.component.tool import ToolComponent, ToolParam, require_text, results_output


class WikipediaParam(ToolParam):
    tool_inputs = {
        "query": {
            "type": "string",
            "description": "The search keyword: a specific subject that can match a page title.",
            "default": "{sys.query}",
            "required": True,
        }
    }

    def __init__(self) -> None:
        super().__init__()
        self.top_n: Any = 10
        self.language = "en"

    def check(self) -> None:
        self.check_positive_int("top_n", maximum=50)
        if not isinstance(self.language, str) or not re.fullmatch(r"[a-z]{2,3}(-[a-z]+)?", self.language):
            raise ValueError(f"language must be a Wikipedia language code like 'en', got {self.language!r}")


@register
class Wikipedia(ToolComponent):
    component_name = "Wikipedia"
    param_class = WikipediaParam
    tool_name = "wikipedia_search"
    tool_description = "Wikipedia, the free encyclopedia: search it for pages about a subject."
    settings_name = "wikipedia"
    default_base_url = "https://{language}.wikipedia.org"

    def run_tool(self, query: Any = None) -> None:
        query = require_text(self, "query", query)
        if not query:
            self.set_output("formalized_content", "")
            return
        base = self.base_url().replace("{language}", self._param.language)
        answer = self.call_json(
            "GET",
            "/w/api.php",
            base_url=base,
            query={
                "action": "query",
                "format": "json",
                "formatversion": 2,
                "generator": "search",
                "gsrsearch": query,
                "gsrlimit": int(self._param.top_n),
                "prop": "extracts|info",
                "exintro": 1,
                "explaintext": 1,
                "inprop": "url",
                "redirects": 1,
            },
        )
        pages = (answer or {}).get("query", {}).get("pages", []) if isinstance(answer, dict) else []
        if isinstance(pages, dict):  # formatversion 1: keyed by page id
            pages = list(pages.values())
        pages = sorted((p for p in pages if isinstance(p, dict)), key=lambda p: p.get("index", 0))
        found = [
            {"title": p.get("title"), "url": p.get("fullurl"), "summary": p.get("extract")} for p in pages
        ]
        chunks = [{"title": p["title"], "url": p["url"], "content": p["summary"]} for p in found]
        results_output(self, chunks, found)
