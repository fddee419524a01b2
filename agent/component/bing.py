"""Bing: the Bing Web Search API v7 (RAGFlow's ``web_search_assistant`` template offers
it although RAGFlow's backend no longer has it).

Params (as that template writes them): ``query`` (default ``{sys.query}``),
``channel`` (``Webpages`` or ``News``), ``top_n`` (10), ``country`` (``cc``, e.g.
``CH``), ``language`` (``setLang``, e.g. ``en``), ``api_key`` (the subscription key).
Outputs ``formalized_content`` and ``json`` (Bing's ``webPages.value`` or
``news.value``).

The API: ``GET {base_url}/v7.0/search?q=…`` with ``Ocp-Apim-Subscription-Key``
(https://learn.microsoft.com/en-us/bing/search-apis/bing-web-search/reference/endpoints).
Settings ``tools.bing.*``.
"""

from __future__ import annotations

from typing import Any

from agent.component import register
from agent.component.tool import ToolComponent, ToolParam, require_text, results_output


class BingParam(ToolParam):
    tool_inputs = {
        "query": {
            "type": "string",
            "description": "The search keywords: the most important words of the request.",
            "default": "{sys.query}",
            "required": True,
        }
    }

    def __init__(self) -> None:
        super().__init__()
        self.channel = "Webpages"
        self.top_n: Any = 10
        self.country = "US"
        self.language = "en"

    def check(self) -> None:
        self.check_choice("channel", ("Webpages", "News"))
        self.check_positive_int("top_n", maximum=50)


@register
class Bing(ToolComponent):
    component_name = "Bing"
    param_class = BingParam
    tool_name = "bing_search"
    tool_description = "Search the web with Bing: web pages or news."
    settings_name = "bing"
    default_base_url = "https://api.bing.microsoft.com"

    def run_tool(self, query: Any = None) -> None:
        query = require_text(self, "query", query)
        if not query:
            self.set_output("formalized_content", "")
            return
        news = self._param.channel == "News"
        answer = self.call_json(
            "GET",
            "/v7.0/search",
            query={
                "q": query,
                "count": int(self._param.top_n),
                "cc": self._param.country,
                "setLang": self._param.language,
                "responseFilter": "News" if news else "Webpages",
                "textFormat": "Raw",
            },
            headers={"Ocp-Apim-Subscription-Key": self.api_key()},
        )
        section = (answer or {}).get("news" if news else "webPages") if isinstance(answer, dict) else None
        results = section.get("value") if isinstance(section, dict) else []
        results = [r for r in results or [] if isinstance(r, dict)]
        chunks = [
            {
                "title": r.get("name"),
                "url": r.get("url"),
                "content": r.get("description" if news else "snippet"),
            }
            for r in results
        ]
        results_output(self, chunks, results)
