"""RAGFlow's web tools against local servers speaking each API's shapes
(tests/tool_servers.py): params, outputs, errors, keys kept secret, deadline and
cancel, the address rules, and use as an Agent tool."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from agent.canvas import Canvas, Limits
from tests.agent.dsl_helpers import answer, final, make_dsl, node, outputs_of, run
from tests.llm_server import LLMServer, text, tool_call
from tests.tool_servers import KEYS, ToolServer


@pytest.fixture(scope="module")
def server():
    with ToolServer() as s:
        yield s


@pytest.fixture(autouse=True)
def _fresh(server):
    server.requests.clear()
    server.delay = 0.0
    server.fail_status = None


def tool_canvas(
    server, kind: str, params: dict, show: str = "formalized_content", limits=None, **settings
) -> Canvas:
    dsl = make_dsl(
        node(f"{kind}:T", kind, params),
        node("Message:Out", "Message", {"content": [f"{{{kind}:T@{show}}}"]}),
    )
    return Canvas(dsl, services={"tools": server.tools_settings(**settings)}, limits=limits)


def test_tavily_search_sends_ragflows_params_and_outputs_results(server):
    params = {
        "query": "sys.query",
        "topic": "news",
        "max_results": "2",
        "days": 7,
        "search_depth": "advanced",
    }
    events = run(tool_canvas(server, "TavilySearch", params), "solar power")
    assert final(events)["status"] == "succeeded", final(events)
    (request,) = server.requests
    assert request["path"] == "/tavily/search"
    assert request["headers"]["Authorization"] == f"Bearer {KEYS['tavily']}"
    body = request["body"]
    assert (body["query"], body["topic"], body["max_results"], body["days"], body["search_depth"]) == (
        "solar power",
        "news",
        2,
        7,
        "advanced",
    )
    out = outputs_of(events, "TavilySearch:T")
    assert [r["title"] for r in out["json"]] == ["solar power result 0", "solar power result 1"]
    assert out["formalized_content"].startswith(
        "\nID: 0\n├── Title: solar power result 0\n├── URL: https://example.com/0\n└── Content:\nAbout solar power, part 0."
    )
    assert answer(events) == out["formalized_content"]


def test_tavily_extract_takes_urls_as_a_list_or_comma_text(server):
    canvas = tool_canvas(
        server, "TavilyExtract", {"urls": "https://a.example, https://b.example"}, show="json"
    )
    events = run(canvas, "x")
    assert server.requests[0]["body"]["urls"] == ["https://a.example", "https://b.example"]
    assert [r["url"] for r in outputs_of(events, "TavilyExtract:T")["json"]] == [
        "https://a.example",
        "https://b.example",
    ]


def test_duckduckgo_reads_the_instant_answer_api(server):
    events = run(tool_canvas(server, "DuckDuckGo", {"top_n": 2, "channel": "text"}), "rust language")
    assert server.requests[0]["query"]["q"] == "rust language"
    results = outputs_of(events, "DuckDuckGo:T")["json"]
    assert results == [
        {
            "title": "Rust Language",
            "href": "https://en.wikipedia.org/wiki/rust_language",
            "body": "rust language is a subject of interest.",
        },
        {
            "title": "rust language A",
            "href": "https://duckduckgo.com/a",
            "body": "rust language A - the first topic",
        },
    ]


def test_wikipedia_searches_and_reads_introductions_in_order(server):
    events = run(tool_canvas(server, "Wikipedia", {"top_n": 5, "language": "de"}), "Berlin")
    query = server.requests[0]["query"]
    assert (query["gsrsearch"], query["gsrlimit"], query["prop"]) == ("Berlin", "5", "extracts|info")
    pages = outputs_of(events, "Wikipedia:T")["json"]
    assert [p["title"] for p in pages] == ["Berlin (0)", "Berlin (1)"]
    assert "Berlin number 0 is described here." in answer(events)


def test_google_goes_through_serpapi(server):
    params = {"q": "{sys.query}", "country": "us", "language": "en", "num": "2"}
    events = run(tool_canvas(server, "Google", params), "pandas")
    query = server.requests[0]["query"]
    assert (query["engine"], query["q"], query["gl"], query["hl"], query["num"]) == (
        "google",
        "pandas",
        "us",
        "en",
        "2",
    )
    assert [r["link"] for r in outputs_of(events, "Google:T")["json"]] == [
        "https://site0.example/",
        "https://site1.example/",
    ]
    # SerpApi's own error words, not a KeyError.
    done = final(run(tool_canvas(server, "Google", {"country": "us"}), "nothing"))
    assert done["status"] == "failed"
    assert "SerpApi: Google hasn't returned any results for this query." in done["error"]


def test_bing_as_the_template_writes_it(server):
    params = {
        "api_key": "YOUR_API_KEY (obtained from https://www.microsoft.com/en-us/bing/apis/bing-web-search-api)",
        "channel": "Webpages",
        "country": "CH",
        "language": "en",
        "top_n": 10,
    }
    events = run(tool_canvas(server, "Bing", params), "alps")
    request = server.requests[0]
    assert request["headers"]["Ocp-Apim-Subscription-Key"] == KEYS["bing"]  # the placeholder is no key
    assert (request["query"]["q"], request["query"]["cc"]) == ("alps", "CH")
    assert outputs_of(events, "Bing:T")["json"][0]["url"] == "https://bing.example/1"


def test_yahoo_finance_reports_markdown_sections(server):
    params = {"stock_code": "sys.query", "info": True, "balance_sheet": True, "news": True, "history": True}
    events = run(tool_canvas(server, "YahooFinance", params, show="report"), "aapl")
    report = outputs_of(events, "YahooFinance:T")["report"]
    assert report.startswith("# Information:\n|  | 0 |")
    assert "| longName | Apple Inc. |" in report
    assert "# Balance sheet:\n|  | 2024-09-30 |\n|:---|:---|\n| Total Assets | 364980000000 |" in report
    assert "# History:\n| Date | Open | High | Low | Close | Volume |" in report
    assert "| 0 | AAPL hits a record | Wire | https://news.example/1 | 2024-09-30 |" in report
    done = final(run(tool_canvas(server, "YahooFinance", {"stock_code": "sys.query"}, show="report"), "ZZZZ"))
    assert "answered 404 Not Found: Quote not found for symbol: ZZZZ" in done["error"]


@pytest.mark.parametrize(
    "kind, settings, message",
    [
        (
            "TavilySearch",
            {"tavily": {"api_key": "wrong"}},
            "answered 401 Unauthorized: Unauthorized: missing or invalid API key.",
        ),
        (
            "Google",
            {"google": {"api_key": ""}},
            "no API key: set tools.google.api_key in service_conf.yaml or AGENTCANVAS_TOOLS_GOOGLE_API_KEY",
        ),
        (
            "Bing",
            {"bing": {"api_key": "nope"}},
            "answered 401 Unauthorized: Access denied due to invalid subscription key.",
        ),
    ],
)
def test_key_problems_are_clear_errors_that_never_show_a_key(server, caplog, kind, settings, message):
    caplog.set_level(logging.DEBUG)
    params = {"q": "{sys.query}"} if kind == "Google" else {}
    canvas = tool_canvas(server, kind, params, **settings)
    events = run(canvas, "anything")
    done = final(events)
    assert done["status"] == "failed" and message in done["error"], done["error"]
    seen = json.dumps(events) + str(canvas) + caplog.text
    for key in (*KEYS.values(), "wrong", "nope"):
        if key != "nope" or kind != "Bing":
            assert key not in seen


def test_a_key_from_the_settings_stays_out_of_events_snapshot_and_logs(server, caplog):
    caplog.set_level(logging.DEBUG)
    canvas = tool_canvas(server, "Google", {"q": "{sys.query}", "country": "us"})
    events = run(canvas, "kiwi")
    assert final(events)["status"] == "succeeded"
    assert server.requests[0]["query"]["api_key"] == KEYS["google"]
    for key in KEYS.values():
        assert key not in json.dumps(events) and key not in str(canvas) and key not in caplog.text


def test_a_service_error_status_fails_with_the_status(server):
    server.fail_status = 503
    done = final(run(tool_canvas(server, "DuckDuckGo", {}), "x"))
    assert done["status"] == "failed"
    assert "DuckDuckGo (127.0.0.1) answered 503 Service Unavailable: the service is down" in done["error"]


def test_private_addresses_are_refused_unless_allow_listed(server):
    canvas = tool_canvas(server, "Wikipedia", {}, wikipedia={"allow_hosts": []})
    done = final(run(canvas, "x"))
    assert done["status"] == "failed"
    assert "refused to call '127.0.0.1'" in done["error"] and "tools.wikipedia.allow_hosts" in done["error"]
    assert server.requests == []


def test_a_slow_service_times_out_with_the_setting_named(server):
    server.delay = 3
    started = time.monotonic()
    done = final(run(tool_canvas(server, "DuckDuckGo", {}, duckduckgo={"timeout_seconds": 0.5}), "x"))
    assert done["status"] == "failed" and "tools.duckduckgo.timeout_seconds" in done["error"]
    assert time.monotonic() - started < 2


def test_the_turn_deadline_and_cancel_stop_a_slow_call(server):
    server.delay = 3
    started = time.monotonic()
    done = final(run(tool_canvas(server, "TavilySearch", {}, limits=Limits(max_seconds=0.5)), "x"))
    assert done["status"] == "failed" and "max_seconds" in done["error"]
    assert time.monotonic() - started < 2

    canvas = tool_canvas(server, "Wikipedia", {})
    flag = threading.Event()
    canvas.cancel_check = flag.is_set
    threading.Timer(0.3, flag.set).start()
    started = time.monotonic()
    assert final(run(canvas, "x"))["status"] == "cancelled"
    assert time.monotonic() - started < 2


def test_web_tools_as_agent_tools(server):
    tools = [
        {"component_name": "TavilySearch", "name": "TavilySearch", "params": {"api_key": ""}},
        {"component_name": "Wikipedia", "name": "Wikipedia", "params": {"language": "en", "top_n": 10}},
    ]
    with LLMServer() as llm:
        dsl = make_dsl(
            node("Agent:A", "Agent", {"tools": tools}),
            node("Message:Out", "Message", {"content": ["{Agent:A@content}"]}),
        )
        canvas = Canvas(dsl, services={"llm_settings": llm.settings(), "tools": server.tools_settings()})
        llm.queue(
            tool_call(
                "TavilySearch", {"query": "moon", "topic": "general"}, ("Wikipedia", {"query": "Moon"})
            ),
            text("Found it."),
        )
        events = run(canvas, "tell me about the moon")
        assert answer(events) == "Found it."
        first, second = llm.chat_requests()
        specs = {t["function"]["name"]: t["function"] for t in first["tools"]}
        assert specs["TavilySearch"]["parameters"]["required"] == ["query"]
        assert specs["TavilySearch"]["parameters"]["properties"]["topic"]["enum"] == ["general", "news"]
        results = [m["content"] for m in second["messages"] if m["role"] == "tool"]
        assert results[0].startswith("\nID: 0\n├── Title: moon result 0")
        assert "Moon number 0 is described here." in results[1]
