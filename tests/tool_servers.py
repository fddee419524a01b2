"""Local stand-ins for the web services RAGFlow's tools call, for tests.

    with ToolServer() as server:                  # 127.0.0.1, a free port, in a thread
        canvas = Canvas(dsl, services={"tools": server.tools_settings()})
        ...
        server.requests[-1]                       # {"method", "path", "query", "headers", "body"}

One server answers every service's documented request and response shapes:

* Tavily (https://docs.tavily.com): ``POST /tavily/search``, ``POST /tavily/extract``,
  key in ``Authorization: Bearer``;
* DuckDuckGo's Instant Answer API: ``GET /duckduckgo/?q=…&format=json``;
* Wikipedia's MediaWiki API: ``GET /wikipedia/w/api.php?action=query&generator=search…``;
* SerpApi (Google): ``GET /serpapi/search.json?engine=google&q=…&api_key=…``;
* Bing Web Search v7: ``GET /bing/v7.0/search?q=…``, key in ``Ocp-Apim-Subscription-Key``;
* Yahoo Finance: ``GET /yahoo/v10/finance/quoteSummary/<ticker>``, ``/v8/finance/chart/<ticker>``,
  ``/v1/finance/search``.

Each service checks its key (:data:`KEYS`) and answers a wrong one as that service
does (401/403 with its error body). ``server.delay`` makes every answer wait (for
deadline tests); ``server.fail_status`` makes every answer that HTTP status.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

KEYS = {
    "tavily": "tvly-test-key-123",
    "google": "serpapi-test-key-456",
    "bing": "bing-test-key-789",
}


def words(text: str) -> str:
    return " ".join(str(text).split())


class ToolServer:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.delay = 0.0
        self.fail_status: int | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                server._handle(self)

            def do_POST(self) -> None:  # noqa: N802
                server._handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ToolServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def tools_settings(self, **overrides: Any) -> dict:
        """The ``tools`` settings pointing every web tool here, with the right keys."""
        base = {"allow_hosts": ["127.0.0.1"], "timeout_seconds": 5}
        settings = {
            "tavily": {**base, "base_url": f"{self.url}/tavily", "api_key": KEYS["tavily"]},
            "duckduckgo": {**base, "base_url": f"{self.url}/duckduckgo"},
            "wikipedia": {**base, "base_url": f"{self.url}/wikipedia"},
            "google": {**base, "base_url": f"{self.url}/serpapi", "api_key": KEYS["google"]},
            "bing": {**base, "base_url": f"{self.url}/bing", "api_key": KEYS["bing"]},
            "yahoofinance": {**base, "base_url": f"{self.url}/yahoo"},
        }
        for name, values in overrides.items():
            settings[name] = {**settings.get(name, {}), **values}
        return settings

    # ------------------------------------------------------------------ answering
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        record = {
            "method": h.command,
            "path": parts.path,
            "query": query,
            "headers": dict(h.headers),
            "body": body,
        }
        with self._lock:
            self.requests.append(record)
        if self.delay:
            self._stop.wait(self.delay)
        if self.fail_status:
            return _send(h, self.fail_status, {"error": "the service is down"})
        service, _, rest = parts.path.lstrip("/").partition("/")
        handler = getattr(self, f"_{service}", None)
        if handler is None:
            return _send(h, 404, {"error": f"no service {service!r}"})
        status, answer = handler("/" + rest, query, body, h.headers)
        _send(h, status, answer)

    def _tavily(self, path: str, query: dict, body: Any, headers: Any) -> tuple[int, Any]:
        if headers.get("Authorization") != f"Bearer {KEYS['tavily']}":
            return 401, {"detail": {"error": "Unauthorized: missing or invalid API key."}}
        if path == "/search":
            q = body["query"]
            results = [
                {
                    "title": f"{q} result {i}",
                    "url": f"https://example.com/{i}",
                    "content": f"About {q}, part {i}.",
                    "score": 0.9 - i / 10,
                    "raw_content": None,
                }
                for i in range(min(int(body.get("max_results", 5)), 3))
            ]
            return 200, {"query": q, "answer": None, "images": [], "results": results, "response_time": 0.1}
        if path == "/extract":
            results = [
                {"url": u, "raw_content": f"# Page {u}\nThe text of {u}.", "images": []} for u in body["urls"]
            ]
            return 200, {"results": results, "failed_results": [], "response_time": 0.1}
        return 404, {"detail": {"error": "Not Found"}}

    def _duckduckgo(self, path: str, query: dict, body: Any, headers: Any) -> tuple[int, Any]:
        q = query.get("q", "")
        if query.get("format") != "json":
            return 400, "format=json is required"
        return 200, {
            "Heading": q.title(),
            "AbstractText": f"{q} is a subject of interest.",
            "AbstractURL": f"https://en.wikipedia.org/wiki/{q.replace(' ', '_')}",
            "Results": [],
            "RelatedTopics": [
                {"FirstURL": "https://duckduckgo.com/a", "Text": f"{q} A - the first topic", "Result": "<a>"},
                {
                    "Name": "More",
                    "Topics": [{"FirstURL": "https://duckduckgo.com/b", "Text": f"{q} B - another"}],
                },
            ],
        }

    def _wikipedia(self, path: str, query: dict, body: Any, headers: Any) -> tuple[int, Any]:
        if path != "/w/api.php" or query.get("action") != "query" or query.get("generator") != "search":
            return 400, {"error": {"code": "badparams", "info": "unexpected request"}}
        q = query["gsrsearch"]
        limit = int(query.get("gsrlimit", 10))
        pages = [
            {
                "pageid": 100 + i,
                "title": f"{q} ({i})",
                "index": i + 1,
                "extract": f"{q} number {i} is described here.",
                "fullurl": f"https://en.wikipedia.org/wiki/{q}_{i}",
            }
            for i in reversed(range(min(limit, 2)))
        ]
        return 200, {"batchcomplete": True, "query": {"pages": pages}}

    def _serpapi(self, path: str, query: dict, body: Any, headers: Any) -> tuple[int, Any]:
        if query.get("api_key") != KEYS["google"]:
            return 401, {
                "error": "Invalid API key. Your API key should be here: https://serpapi.com/manage-api-key"
            }
        q = query.get("q", "")
        if q == "nothing":
            return 200, {
                "search_metadata": {"status": "Success"},
                "error": "Google hasn't returned any results for this query.",
            }
        organic = [
            {
                "position": i + 1,
                "title": f"{q} page {i}",
                "link": f"https://site{i}.example/",
                "snippet": f"Snippet {i} on {q}.",
            }
            for i in range(min(int(query.get("num", 10)), 2))
        ]
        return 200, {"search_metadata": {"status": "Success"}, "organic_results": organic}

    def _bing(self, path: str, query: dict, body: Any, headers: Any) -> tuple[int, Any]:
        if headers.get("Ocp-Apim-Subscription-Key") != KEYS["bing"]:
            return 401, {
                "error": {"code": "401", "message": "Access denied due to invalid subscription key."}
            }
        q = query.get("q", "")
        pages = [{"name": f"{q} on the web", "url": "https://bing.example/1", "snippet": f"All about {q}."}]
        news = [{"name": f"{q} news", "url": "https://bing.example/n", "description": f"News of {q}."}]
        return 200, {"_type": "SearchResponse", "webPages": {"value": pages}, "news": {"value": news}}

    def _yahoo(self, path: str, query: dict, body: Any, headers: Any) -> tuple[int, Any]:
        if path.startswith("/v10/finance/quoteSummary/"):
            ticker = path.rsplit("/", 1)[1]
            if ticker != "AAPL":
                return 404, {
                    "quoteSummary": {
                        "result": None,
                        "error": {
                            "code": "Not Found",
                            "description": "Quote not found for symbol: " + ticker,
                        },
                    }
                }
            modules = query.get("modules", "").split(",")
            result: dict = {}
            if "assetProfile" in modules:
                result["assetProfile"] = {"industry": "Consumer Electronics", "fullTimeEmployees": 164000}
                result["price"] = {
                    "longName": "Apple Inc.",
                    "regularMarketPrice": {"raw": 234.5, "fmt": "234.50"},
                }
                result["summaryDetail"] = {"marketCap": {"raw": 3.5e12, "fmt": "3.5T"}}
            if "balanceSheetHistory" in modules:
                statement = {
                    "endDate": {"raw": 1727654400, "fmt": "2024-09-30"},
                    "totalAssets": {"raw": 364980000000},
                    "totalDebt": {"raw": 106629000000},
                }
                result["balanceSheetHistory"] = {"balanceSheetStatements": [statement]}
                result["balanceSheetHistoryQuarterly"] = {"balanceSheetStatements": [statement]}
            return 200, {"quoteSummary": {"result": [result], "error": None}}
        if path.startswith("/v8/finance/chart/"):
            quote = {
                "open": [1.0, 2.0],
                "high": [2.0, 3.0],
                "low": [0.5, 1.5],
                "close": [1.5, 2.5],
                "volume": [10, 20],
            }
            return 200, {
                "chart": {
                    "result": [{"timestamp": [1727654400, 1727740800], "indicators": {"quote": [quote]}}],
                    "error": None,
                }
            }
        if path == "/v1/finance/search":
            news = [
                {
                    "title": f"{query.get('q')} hits a record",
                    "publisher": "Wire",
                    "link": "https://news.example/1",
                    "providerPublishTime": 1727654400,
                }
            ]
            return 200, {"quotes": [], "news": news}
        return 404, {"finance": {"error": {"code": "Not Found"}}}


def _send(h: BaseHTTPRequestHandler, status: int, answer: Any) -> None:
    data = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
    try:
        h.send_response(status)
        h.send_header("Content-Type", "text/plain" if isinstance(answer, str) else "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):
        pass
