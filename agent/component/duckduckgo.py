"""DuckDuckGo: search through DuckDuckGo's Instant Answer API (RAGFlow's tool).

Params (RAGFlow's): ``query`` (default ``{sys.query}``), ``channel`` (``text`` or
``news``; a model may say ``general`` for text), ``top_n`` (10). Outputs
``formalized_content`` and ``json`` (``[{title, href, body}]``, the shape RAGFlow's
DuckDuckGo library gives).

The API: ``GET {base_url}/?q=…&format=json&no_html=1&skip_disambig=1``
(https://duckduckgo.com/duckduckgo-help-pages/open-source/instant-answer-interface/):
the abstract and the ``Results`` and ``RelatedTopics`` (topics grouped under a
``Name`` are flattened). It has no news search: ``news`` asks the same API. RAGFlow's
library scrapes the HTML result pages instead, which DuckDuckGo does not offer as an
API. Settings ``tools.duckduckgo.*``.
"""

from __future__ import annotations

from typing import Any

from agent.component import register
from agent.component.tool import ToolComponent, ToolParam, require_text, results_output


class DuckDuckGoParam(ToolParam):
    tool_inputs = {
        "query": {
            "type": "string",
            "description": "The search keywords: the most important words of the request.",
            "default": "{sys.query}",
            "required": True,
        },
        "channel": {
            "type": "string",
            "description": "general for web pages, news for current events.",
            "enum": ["general", "news"],
            "default": "text",
        },
    }

    def __init__(self) -> None:
        super().__init__()
        self.top_n: Any = 10

    def check(self) -> None:
        self.check_positive_int("top_n")
        self.check_choice("channel", ("text", "news", "general"))


def _topics(items: Any) -> list[dict]:
    out = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and isinstance(item.get("Topics"), list):
            out.extend(_topics(item["Topics"]))
        elif isinstance(item, dict) and item.get("FirstURL") and item.get("Text"):
            text = str(item["Text"])
            out.append({"title": text.split(" - ", 1)[0], "href": item["FirstURL"], "body": text})
    return out


@register
class DuckDuckGo(ToolComponent):
    component_name = "DuckDuckGo"
    param_class = DuckDuckGoParam
    tool_name = "duckduckgo_search"
    tool_description = "DuckDuckGo is a privacy-focused search engine: search it for web pages."
    settings_name = "duckduckgo"
    default_base_url = "https://api.duckduckgo.com"

    def run_tool(self, query: Any = None, channel: Any = None) -> None:
        query = require_text(self, "query", query)
        if not query:
            self.set_output("formalized_content", "")
            return
        answer = self.call_json(
            "GET",
            "/",
            query={"q": query, "format": "json", "no_html": 1, "skip_disambig": 1, "t": "agentcanvas"},
        )
        if not isinstance(answer, dict):
            raise self.fail("DuckDuckGo's answer is not a JSON object")
        results = []
        if answer.get("AbstractText") and answer.get("AbstractURL"):
            results.append(
                {
                    "title": answer.get("Heading") or query,
                    "href": answer["AbstractURL"],
                    "body": answer["AbstractText"],
                }
            )
        results += _topics(answer.get("Results")) + _topics(answer.get("RelatedTopics"))
        results = results[: int(self._param.top_n)]
        chunks = [{"title": r["title"], "url": r["href"], "content": r["body"]} for r in results]
        results_output(self, chunks, results)
