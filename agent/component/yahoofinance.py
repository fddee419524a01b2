"""YahooFinance: stock information from Yahoo Finance (RAGFlow's tool).

Params (RAGFlow's): ``stock_code`` (default ``{sys.query}``; a ticker such as
``AAPL``) and which sections to report: ``info`` (true), ``history``,
``financials`` (the calendar, as RAGFlow shows it), ``balance_sheet``,
``cash_flow_statement``, ``news`` (true); ``count`` and ``income_stmt`` are accepted
(RAGFlow reports neither). Output ``report``: Markdown, one ``# Section:`` with a table
each, as RAGFlow's (pandas ``to_markdown``) report reads.

The API: Yahoo Finance's JSON endpoints that RAGFlow's ``yfinance`` library reads —
``GET {base_url}/v10/finance/quoteSummary/<ticker>?modules=…`` (profile, summary,
price, calendar, balance sheets, cash flows: ``{"quoteSummary": {"result": [...],
"error": …}}``), ``/v8/finance/chart/<ticker>`` (a month of daily prices) and
``/v1/finance/search?q=<ticker>`` (news). Settings ``tools.yahoofinance.*``.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from agent.component import register
from agent.component.tool import ToolComponent, ToolParam, markdown_table, require_text

_SECTIONS = (
    "info",
    "history",
    "count",
    "financials",
    "income_stmt",
    "balance_sheet",
    "cash_flow_statement",
    "news",
)


class YahooFinanceParam(ToolParam):
    tool_inputs = {
        "stock_code": {
            "type": "string",
            "description": "The stock code (ticker), e.g. AAPL.",
            "default": "{sys.query}",
            "required": True,
        }
    }

    def __init__(self) -> None:
        super().__init__()
        self.info = True
        self.history = False
        self.count = False
        self.financials = False
        self.income_stmt = False
        self.balance_sheet = False
        self.cash_flow_statement = False
        self.news = True

    def check(self) -> None:
        for name in _SECTIONS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")


def _plain(value: Any) -> Any:
    """Yahoo's ``{"raw", "fmt"}`` numbers as their raw value."""
    if isinstance(value, dict) and "raw" in value:
        return value["raw"]
    if isinstance(value, dict) and not value:
        return None
    return value


def _title(key: str) -> str:
    """``totalAssets`` → ``Total Assets`` (the row names yfinance gives)."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", key)
    return spaced[:1].upper() + spaced[1:]


def _statements(statements: list[dict]) -> str:
    """Statements by date as a table: one row per item, one column per date."""
    dates = [_date(s.get("endDate") or {}) for s in statements]
    items: list[str] = []
    for s in statements:
        items += [k for k in s if k not in ("endDate", "maxAge") and k not in items]
    rows = [[_title(item), *(_plain(s.get(item)) for s in statements)] for item in items]
    return markdown_table(["", *dates], rows)


def _date(value: Any) -> str:
    if isinstance(value, dict):
        if value.get("fmt"):
            return str(value["fmt"])
        value = value.get("raw")
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%d")
    return str(value or "")


@register
class YahooFinance(ToolComponent):
    component_name = "YahooFinance"
    param_class = YahooFinanceParam
    tool_name = "yahoo_finance"
    tool_description = (
        "Yahoo Finance: real-time and historical stock market data — quotes, company profile, "
        "financial statements and news — for a stock code."
    )
    settings_name = "yahoofinance"
    default_base_url = "https://query2.finance.yahoo.com"

    def run_tool(self, stock_code: Any = None) -> None:
        code = require_text(self, "stock_code", stock_code).strip().upper()
        if not code:
            self.set_output("report", "")
            return
        if not re.fullmatch(r"[A-Z0-9.^=\-]{1,20}", code):
            raise self.fail(f"stock_code {code[:40]!r} is not a ticker like 'AAPL'", retryable=False)
        p = self._param
        modules = []
        if p.info:
            modules += ["assetProfile", "summaryDetail", "price"]
        if p.financials:
            modules.append("calendarEvents")
        if p.balance_sheet:
            modules += ["balanceSheetHistory", "balanceSheetHistoryQuarterly"]
        if p.cash_flow_statement:
            modules += ["cashflowStatementHistory", "cashflowStatementHistoryQuarterly"]
        summary: dict = {}
        if modules:
            answer = self.call_json(
                "GET", f"/v10/finance/quoteSummary/{code}", query={"modules": ",".join(modules)}
            )
            block = (answer or {}).get("quoteSummary") if isinstance(answer, dict) else None
            if not isinstance(block, dict) or not block.get("result"):
                error = (block or {}).get("error") if isinstance(block, dict) else None
                detail = error.get("description") if isinstance(error, dict) else error
                raise self.fail(
                    f"Yahoo Finance has no data for {code!r}: {detail or 'empty answer'}", retryable=False
                )
            summary = block["result"][0]
        sections = []
        if p.info:
            info = {}
            for module in ("assetProfile", "summaryDetail", "price"):
                info.update({k: v for k, v in (summary.get(module) or {}).items() if not isinstance(v, list)})
            rows = [[k, _plain(v)] for k, v in info.items()]
            sections.append("# Information:\n" + markdown_table(["", "0"], rows))
        if p.history:
            sections.append("# History:\n" + self._history(code))
        if p.financials:
            calendar = (summary.get("calendarEvents") or {}).get("earnings") or {}
            rows = [
                [_title(k), [_date(x) for x in v] if isinstance(v, list) else _plain(v)]
                for k, v in calendar.items()
            ]
            sections.append("# Calendar:\n" + markdown_table(["", "0"], rows))
        if p.balance_sheet:
            yearly = (summary.get("balanceSheetHistory") or {}).get("balanceSheetStatements") or []
            quarterly = (summary.get("balanceSheetHistoryQuarterly") or {}).get(
                "balanceSheetStatements"
            ) or []
            sections.append("# Balance sheet:\n" + _statements(yearly))
            sections.append("# Quarterly balance sheet:\n" + _statements(quarterly))
        if p.cash_flow_statement:
            yearly = (summary.get("cashflowStatementHistory") or {}).get("cashflowStatements") or []
            quarterly = (summary.get("cashflowStatementHistoryQuarterly") or {}).get(
                "cashflowStatements"
            ) or []
            sections.append("# Cash flow statement:\n" + _statements(yearly))
            sections.append("# Quarterly cash flow statement:\n" + _statements(quarterly))
        if p.news:
            sections.append("# News:\n" + self._news(code))
        self.set_output("report", "\n\n".join(s + "\n" for s in sections))

    def _history(self, code: str) -> str:
        answer = self.call_json("GET", f"/v8/finance/chart/{code}", query={"range": "1mo", "interval": "1d"})
        result = (
            (((answer or {}).get("chart") or {}).get("result") or [{}])[0] if isinstance(answer, dict) else {}
        )
        stamps = result.get("timestamp") or []
        quote = ((result.get("indicators") or {}).get("quote") or [{}])[0]
        columns = ["open", "high", "low", "close", "volume"]
        rows = [
            [_date(t), *((quote.get(c) or [None] * len(stamps))[i] for c in columns)]
            for i, t in enumerate(stamps)
        ]
        return markdown_table(["Date", *(c.title() for c in columns)], rows)

    def _news(self, code: str) -> str:
        answer = self.call_json(
            "GET", "/v1/finance/search", query={"q": code, "newsCount": 8, "quotesCount": 0}
        )
        items = (answer or {}).get("news") or [] if isinstance(answer, dict) else []
        rows = [
            [i, n.get("title"), n.get("publisher"), n.get("link"), _date(n.get("providerPublishTime"))]
            for i, n in enumerate(x for x in items if isinstance(x, dict))
        ]
        return markdown_table(["", "title", "publisher", "link", "providerPublishTime"], rows)

    def tool_result(self) -> str | None:
        return self.outputs.get("report")
