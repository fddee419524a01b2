"""Browser tests: Debian's Chromium driven by Playwright against a real server process.

Fixtures (one server per test module, on SQLite, with a test LLM server behind it):

* ``site`` — a :class:`Site`: the server, an API token and an embed token of one tenant.
* ``llm`` — the :class:`tests.llm_server.LLMServer` the server's LLM components call.
* ``browser`` / ``context`` — Chromium, and a fresh browser profile per test (its own
  localStorage: another end user).
* ``parent_sites`` — two small HTTP servers on other 127.0.0.1 ports (other origins)
  serving pages that frame a given URL.

Screenshots go to ``tests/artifacts/browser/`` (:func:`shot`).
"""

from __future__ import annotations

import html
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from tests.api.conftest import ROOT, sample
from tests.e2e.conftest import Client, Deployment
from tests.llm_server import API_KEY, DEFAULT_MODEL, LLMServer

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "tests" / "artifacts" / "browser"

# Waiting for the page is a safety net (a broken page fails instead of hanging), not a
# timing assertion: generous.
expect.set_options(timeout=20_000)


def shot(page: Page, name: str) -> Path:
    """Save a screenshot of the page as ``tests/artifacts/browser/<name>.png``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@dataclass
class Site:
    """The server under test and one tenant's tokens."""

    deployment: Deployment
    url: str
    api_token: str
    embed_token: str

    @property
    def api(self) -> Client:
        return Client(self.url, self.api_token)

    def agent(self, dsl_or_sample: dict | str, title: str | None = None) -> str:
        """A new agent (a DSL, or a sample's name); its id."""
        dsl = sample(dsl_or_sample) if isinstance(dsl_or_sample, str) else dsl_or_sample
        return self.api.create_agent(title or f"agent {uuid.uuid4().hex[:8]}", dsl)

    def page_url(self, agent_id: str, token: str | None = None) -> str:
        return f"{self.url}/embed/agents/{agent_id}?auth={token or self.embed_token}"

    def new_embed_token(self) -> str:
        resp = self.api.post("/system/tokens", json={"kind": "embed"})
        assert resp.status_code == 200, resp.text
        return resp.json()["data"]["token"]


@pytest.fixture(scope="module")
def llm() -> Iterator[LLMServer]:
    with LLMServer() as server:
        yield server


@pytest.fixture(scope="module")
def site_env() -> dict[str, str]:
    """Extra environment for the module's server (a test module may override it)."""
    return {}


@pytest.fixture(scope="module")
def site(tmp_path_factory, llm, site_env) -> Iterator[Site]:
    workdir = tmp_path_factory.mktemp("browser")
    deployment = Deployment(f"sqlite:///{workdir / 'agentcanvas.db'}", workdir)
    try:
        api_token = deployment.token("browser")
        embed_token = deployment.cli("token", "create", "--tenant", "browser", "--embed").split()[-1]
        server = deployment.server(
            AGENTCANVAS_LLM_BASE_URL=llm.url,
            AGENTCANVAS_LLM_API_KEY=API_KEY,
            AGENTCANVAS_LLM_MODEL=DEFAULT_MODEL,
            AGENTCANVAS_LLM_MAX_RETRIES="0",
            **site_env,
        )
        yield Site(deployment, server.url, api_token, embed_token)
    finally:
        deployment.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's Chromium with `make browser`")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def context(browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 820, "height": 760})
    try:
        yield ctx
    finally:
        ctx.close()


class ParentSite:
    """Another origin (its own port): ``/frame?src=URL`` is a page that frames URL."""

    def __init__(self, name: str):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                src = query.get("src", [""])[0]
                body = (
                    f"<!doctype html><html><head><title>{html.escape(outer.name)}</title></head><body>"
                    f"<h1>{html.escape(outer.name)}</h1><p>A page of another site that embeds the chat.</p>"
                    f'<iframe id="chat" title="Chat" src="{html.escape(src)}" style="width:760px;height:560px;border:1px solid #999">'
                    "</iframe></body></html>"
                )
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.name = name
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def framing(self, src: str) -> str:
        return f"{self.origin}/frame?src={quote(src, safe='')}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def parent_sites() -> Iterator[tuple[ParentSite, ParentSite]]:
    """``(allowed, other)``: two parent sites on their own origins."""
    sites = (ParentSite("Allowed shop"), ParentSite("Some other site"))
    try:
        yield sites
    finally:
        for s in sites:
            s.close()
