"""End-to-end set-up: real ``agentcanvas serve`` processes talking HTTP to real clients.

Fixtures:

* ``database_url`` — a new SQLite file, or a throwaway MariaDB or Postgres database
  ``agentcanvas_e2e_<random>`` dropped at the end. Tests run on SQLite and MariaDB
  unless they pick others with
  ``@pytest.mark.parametrize("database_url", ["mysql", "postgres"], indirect=True)``.
* ``deployment`` — a :class:`Deployment` on that database: runs the ``agentcanvas``
  CLI (tokens, agent import) and starts server processes on free ports; every process
  it started is stopped at the end, even when the test fails.
* ``slow_http`` — a :class:`SlowHTTPServer` on 127.0.0.1 for Invoke components whose
  turns must stay running until the test lets them go.
* ``sdk`` and ``rag`` — the ``ragflow_sdk`` package of each supported generation (0.22.1
  and 0.27.x, see :func:`ragflow_sdk`) and a ``RAGFlow`` client of it on a new server:
  a test that takes ``rag`` (or ``sdk``) runs once with each.
* ``module_sdk`` and ``module_database_url`` — the same for a whole module, whose tests
  then share one server (each test a tenant of its own: tests/e2e/test_ragflow_sdk.py).

Servers get ``AGENTCANVAS_INVOKE_ALLOW_HOSTS='["127.0.0.1"]'`` (so Invoke may call
``slow_http``) and poll cancel flags every 50 ms.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zipimport
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import ROOT, dsl_of, parse_sse, throwaway_database

AGENTCANVAS = Path(sys.executable).parent / "agentcanvas"
SAMPLES = ROOT / "samples"
#: How long a server may take to answer after it was started.
START_SECONDS = 60
#: The longest any single HTTP call of a test may take (a safety net against hangs).
HTTP_TIMEOUT = 60


def until(condition: Callable[[], Any], what: str, seconds: float = 30, step: float = 0.02) -> Any:
    """Poll ``condition()`` until it returns something true, and return that.

    A safety net, not a timing assertion: a broken server fails the test after
    ``seconds`` instead of hanging it.
    """
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(step)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------- databases
@pytest.fixture(params=["sqlite", "mysql"])
def database_url(request, tmp_path) -> Iterator[str]:
    """This test's empty database (SQLite file or throwaway MariaDB or Postgres database)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'agentcanvas.db'}"
        return
    yield from throwaway_database(request.param, "agentcanvas_e2e")


# ---------------------------------------------------------------------- servers
class ServerProcess:
    """One ``agentcanvas serve`` process (gunicorn master and its workers, one process group).

    ``command`` is what runs before ``--host/--port/--workers/--threads``: ``agentcanvas
    serve`` of this virtual environment unless told otherwise (``quickstart`` takes the
    same options)."""

    def __init__(
        self,
        env: dict[str, str],
        cwd: Path,
        log_path: Path,
        workers: int,
        threads: int,
        command: tuple[str, ...] = (str(AGENTCANVAS), "serve"),
    ):
        self.command = command
        self.env = env
        self.cwd = cwd
        self.log_path = log_path
        self.workers = workers
        self.threads = threads
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self._terminated = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> ServerProcess:
        """Start on a free port and wait until this very process answers.

        Another test's server may grab the port between our probe and gunicorn's bind;
        gunicorn then says "Connection in use" and we try another port. Readiness needs
        gunicorn's own "Listening at" line for our port, so an answer from someone
        else's server on that port never counts.
        """
        for _ in range(5):
            self.port = free_port()
            env = self.env
            if "PROMETHEUS_MULTIPROC_DIR" not in env:
                # Its workers' metric files in the test's folder, a fresh one each start:
                # the folder a server makes in /tmp is removed when it exits, never when
                # it is killed as a crash would be (every test's teardown).
                metrics = tempfile.mkdtemp(prefix="metrics-", dir=self.log_path.parent)
                env = {**env, "PROMETHEUS_MULTIPROC_DIR": metrics}
            with open(self.log_path, "a", encoding="utf-8") as log:
                self.proc = subprocess.Popen(
                    [*self.command, "--host", "127.0.0.1", "--port", str(self.port)]
                    + ["--workers", str(self.workers), "--threads", str(self.threads)],
                    cwd=self.cwd,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    # Its own process group, so that stop() and kill() reach the workers too.
                    start_new_session=True,
                )
            self._terminated = False
            if self._wait_ready():
                return self
            self.kill()  # still trying to bind; it serves nothing
        pytest.fail(f"the server did not start; its log:\n{self.log()[-4000:]}")

    def _wait_ready(self) -> bool:
        listening = f"Listening at: {self.url}"
        in_use = f"Connection in use: ('127.0.0.1', {self.port})"
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            log = self.log()
            if in_use in log and listening not in log:
                return False
            if self.proc.poll() is not None:
                pytest.fail(f"the server exited with status {self.proc.returncode}; its log:\n{log[-4000:]}")
            if listening in log:
                try:
                    requests.get(f"{self.url}/api/v1/agents", timeout=5)
                    return True
                except requests.RequestException:
                    pass  # listening, but the app is not loaded yet
            time.sleep(0.05)
        pytest.fail(f"the server did not answer within {START_SECONDS} s; its log:\n{self.log()[-4000:]}")

    def kill(self) -> None:
        """SIGKILL the whole server (master and workers) at once, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(30)

    def terminate(self) -> None:
        """Ask the server to stop (SIGTERM: gunicorn's graceful shutdown), once."""
        if self.proc is not None and not self._terminated:
            self._terminated = True
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """Stop gracefully, or SIGKILL what is still there after a while."""
        if self.proc is None:
            return
        self.terminate()
        try:
            self.proc.wait(20)  # gunicorn's master exits after its workers
        except subprocess.TimeoutExpired:
            self.kill()


class Deployment:
    """Server processes and CLI calls sharing one database.

    Args:
        database_url: the ``AGENTCANVAS_DATABASE_URL`` of every process.
        workdir: their working directory (and where the server logs go).
    """

    def __init__(self, database_url: str, workdir: Path):
        if not AGENTCANVAS.exists():
            pytest.fail(
                f"{AGENTCANVAS} is missing: install the project with `make install` (pip install -e .)"
            )
        self.database_url = database_url
        self.workdir = workdir
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTCANVAS_")}
        env.update(
            {
                # The code of this checkout, whatever the virtual environment's editable
                # install points at (another worktree sharing it would serve its own code).
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
                "AGENTCANVAS_DATABASE_URL": database_url,
                "AGENTCANVAS_INVOKE_ALLOW_HOSTS": '["127.0.0.1"]',
                "AGENTCANVAS_SERVER_CANCEL_POLL_SECONDS": "0.05",
            }
        )
        self.env = env
        self.servers: list[ServerProcess] = []

    def cli(self, *args: str) -> str:
        """Run ``agentcanvas ARGS``; its standard output (the command must succeed)."""
        done = subprocess.run(
            [str(AGENTCANVAS), *args],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"agentcanvas {' '.join(args)} failed:\n{done.stderr}"
        return done.stdout

    def token(self, tenant: str = "e2e") -> str:
        """A new API token (``agentcanvas token create``: the last word of the last line)."""
        return self.cli("token", "create", "--tenant", tenant).strip().splitlines()[-1].split()[-1]

    def import_agent(self, path: Path, tenant: str = "e2e", title: str | None = None) -> str:
        """``agentcanvas agent import``; returns the new agent's id (the last word printed)."""
        args = ["agent", "import", str(path), "--tenant", tenant]
        if title:
            args += ["--title", title]
        return self.cli(*args).strip().split()[-1]

    def server(self, workers: int = 1, threads: int = 8, **env: str) -> ServerProcess:
        """Start one more server on this database; ``env`` adds ``AGENTCANVAS_*`` variables."""
        index = len(self.servers)
        server = ServerProcess(
            {**self.env, **env}, self.workdir, self.workdir / f"server-{index}.log", workers, threads
        )
        self.servers.append(server)
        return server.start()

    def close(self) -> None:
        """SIGKILL every server still running: the test is over and asks nothing more of them.

        A graceful stop (SIGTERM) waits up to 2 s for each client's kept-alive connection
        (gunicorn's gthread worker), seconds per test for nothing. A test that checks what a
        graceful stop does calls :meth:`ServerProcess.stop` itself.
        """
        for server in self.servers:
            server.kill()


@pytest.fixture
def deployment(database_url, tmp_path) -> Iterator[Deployment]:
    dep = Deployment(database_url, tmp_path)
    try:
        yield dep
    finally:
        dep.close()


# ---------------------------------------------------------------------- HTTP clients
def metric(server_url: str, name: str, **labels: str) -> float:
    """A sample's value as ``/metrics`` of the server at ``server_url`` gives it (every
    worker's added up); 0 when absent."""
    text = requests.get(f"{server_url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


class Client:
    """Plain HTTP against one server, as one tenant (a token)."""

    def __init__(self, base_url: str, token: str, keep_alive: bool = False):
        """``keep_alive``: every request on one kept-alive connection (so to one worker of
        the server); otherwise each on a new connection."""
        self.base_url = base_url
        self.token = token
        self._http = requests.Session() if keep_alive else requests

    def call(self, method: str, path: str, **kw: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}", **kw.pop("headers", {})}
        kw.setdefault("timeout", HTTP_TIMEOUT)
        return self._http.request(method, f"{self.base_url}/api/v1{path}", headers=headers, **kw)

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.call("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> requests.Response:
        return self.call("POST", path, **kw)

    def create_agent(self, title: str, dsl: dict) -> str:
        resp = self.post("/agents", json={"title": title, "dsl": dsl})
        assert resp.status_code == 200, resp.text
        return resp.json()["data"]["id"]

    def create_session(self, agent_id: str) -> str:
        resp = self.post(f"/agents/{agent_id}/sessions", json={})
        assert resp.status_code == 200, resp.text
        return resp.json()["data"]["id"]

    def session(self, agent_id: str, session_id: str, dsl: bool = False) -> dict:
        """The session as GET returns it (with its message log; with its snapshot if ``dsl``)."""
        resp = self.get(f"/agents/{agent_id}/sessions/{session_id}", params={"dsl": str(dsl).lower()})
        assert resp.status_code == 200, resp.text
        return resp.json()["data"]

    def ask(
        self, agent_id: str, session_id: str | None, question: str = "", **body: Any
    ) -> requests.Response:
        """A blocking completion."""
        payload = {"question": question, "stream": False, **body}
        if session_id is not None:
            payload["session_id"] = session_id
        return self.post(f"/agents/{agent_id}/completions", json=payload)

    def ask_stream(
        self, agent_id: str, session_id: str, question: str = "", **body: Any
    ) -> requests.Response:
        """A streamed completion, not yet read (``stream=True``): read it, or close it early."""
        payload = {"question": question, "stream": True, "session_id": session_id, **body}
        return self.post(f"/agents/{agent_id}/completions", json=payload, stream=True)


def read_sse(resp: requests.Response) -> list:
    """All frames of a streamed reply: events, then ``"[DONE]"``."""
    assert resp.status_code == 200, resp.text
    # What RAGFlow sends, so that proxies pass each frame on at once.
    assert resp.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert resp.headers["Cache-Control"] == "no-cache" and resp.headers["X-Accel-Buffering"] == "no"
    return parse_sse(resp.content.decode("utf-8"))


def streamed_answer(frames: list) -> str:
    return "".join(f["data"]["content"] for f in frames if isinstance(f, dict) and f["event"] == "message")


# ---------------------------------------------------------------------- a slow endpoint
class SlowHTTPServer:
    """An HTTP endpoint on 127.0.0.1 that holds its answers, for Invoke components.

    Every request waits ``delay`` seconds, then until ``gate`` is open (at most
    ``max_hold`` seconds, so nothing hangs), and answers ``{"n": <request number>}``.
    ``hits`` counts the requests that arrived; :meth:`wait_hits` waits for them.
    """

    def __init__(self, delay: float = 0.0, max_hold: float = 60.0):
        self.delay = delay
        self.max_hold = max_hold
        self.gate = threading.Event()
        self.gate.set()
        self.hits = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with outer._lock:
                    outer.hits += 1
                    n = outer.hits
                time.sleep(outer.delay)
                outer.gate.wait(outer.max_hold)
                body = json.dumps({"n": n}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the caller was killed meanwhile

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/slow"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def wait_hits(self, count: int, what: str = "the Invoke request") -> None:
        until(lambda: self.hits >= count, what)

    def close(self) -> None:
        self.gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def slow_http(deployment) -> Iterator[SlowHTTPServer]:
    """Depends on ``deployment`` so that it opens its gate before the servers are stopped."""
    server = SlowHTTPServer()
    try:
        yield server
    finally:
        server.close()


def slow_dsl(slow_url: str) -> dict:
    """A turn that says "working on <query>", calls ``slow_url``, then says "done <n>" (the
    two messages joined by a blank line).

    While the endpoint holds its answer the turn is running, with a chunk already streamed.
    """
    return dsl_of(
        {
            "Message:Start": ("Message", {"content": ["working on {sys.query}"]}, ["Invoke:Slow"]),
            "Invoke:Slow": ("Invoke", {"url": slow_url, "method": "get"}, ["Message:Done"]),
            "Message:Done": ("Message", {"content": ["done {Invoke:Slow@result.n}"]}, []),
        }
    )


# ---------------------------------------------------------------------- ragflow-sdk generations
#: The SDK generations the tests run: 0.22.1 (what pip installs on Python < 3.13, from
#: setup.cfg) and 0.27.x (current RAGFlow; `make install` puts it in its own directory).
SDK_GENERATIONS = ("0.22", "0.27")
#: Where `make install` puts ragflow-sdk 0.27.x (outside site-packages, never on sys.path).
SDK_CURRENT_DIR = Path(sys.prefix) / "ragflow-sdk-0.27"
_sdk_modules: dict[str, ModuleType] = {}


def _take_modules(package: str) -> dict[str, ModuleType]:
    """Remove ``package`` and its submodules from ``sys.modules``; return what was there."""
    taken = {k: v for k, v in sys.modules.items() if k == package or k.startswith(package + ".")}
    for name in taken:
        del sys.modules[name]
    return taken


def ragflow_sdk(generation: str) -> ModuleType:
    """The ``ragflow_sdk`` package of one SDK generation (``"0.22"`` or ``"0.27"``).

    Both are usable in one process, side by side::

        old, new = ragflow_sdk("0.22"), ragflow_sdk("0.27")
        new.RAGFlow(api_key=token, base_url=url).list_agents()

    ``"0.22"`` is the ordinary ``import ragflow_sdk`` (site-packages). ``"0.27"`` is
    imported from :data:`SDK_CURRENT_DIR` under the same name and then taken out of
    ``sys.modules`` again, so that a plain ``import ragflow_sdk`` elsewhere still gets
    0.22; its classes keep working because each module holds its own references. It is
    imported without beartype's import hooks (0.22 needs beartype < 0.19, 0.27 >= 0.20,
    and only one can be installed): 0.27's run-time type checks of the *caller's*
    arguments are off, which changes nothing on the wire.
    """
    if generation in _sdk_modules:
        return _sdk_modules[generation]
    if generation == "0.22":
        module = importlib.import_module("ragflow_sdk")
        assert module.__version__.startswith("0.22"), module.__version__
    elif generation == "0.27":
        if not (SDK_CURRENT_DIR / "ragflow_sdk" / "__init__.py").exists():
            pytest.fail(f"ragflow-sdk 0.27 is not installed in {SDK_CURRENT_DIR}: run `make install`")
        module = _import_isolated("ragflow_sdk", SDK_CURRENT_DIR)
        assert module.__version__.startswith("0.27"), module.__version__
    else:
        raise ValueError(f"unknown ragflow-sdk generation {generation!r}; known: {SDK_GENERATIONS}")
    _sdk_modules[generation] = module
    return module


def _import_isolated(package: str, directory: Path) -> ModuleType:
    """Import ``package`` from ``directory`` without disturbing the one in site-packages."""
    saved_modules = _take_modules(package)
    saved_hooks = list(sys.path_hooks)
    saved_claw = sys.modules.get("beartype.claw", _take_modules)  # a marker for "absent"
    # The plain import machinery: beartype's hook (installed by 0.22) would rewrite 0.27.
    sys.path_hooks[:] = [
        zipimport.zipimporter,
        importlib.machinery.FileFinder.path_hook(
            (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
            (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
            (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES),
        ),
    ]
    sys.modules["beartype.claw"] = None  # 0.27 then skips its own checks (ImportError)
    sys.path.insert(0, str(directory))
    sys.path_importer_cache.clear()
    try:
        return importlib.import_module(package)
    finally:
        sys.path.remove(str(directory))
        if saved_claw is _take_modules:
            del sys.modules["beartype.claw"]
        else:
            sys.modules["beartype.claw"] = saved_claw
        _take_modules(package)
        sys.modules.update(saved_modules)
        sys.path_hooks[:] = saved_hooks
        sys.path_importer_cache.clear()


def sdk_is_current(sdk: ModuleType) -> bool:
    """True for ragflow-sdk 0.26 and later (current RAGFlow's API), False for 0.22."""
    return not sdk.__version__.startswith("0.22")


@pytest.fixture(params=SDK_GENERATIONS, ids=lambda g: f"sdk{g}")
def sdk(request) -> ModuleType:
    """The ``ragflow_sdk`` package of one generation; tests taking it run with each.

    Use ``sdk.RAGFlow`` (or the ``rag`` fixture), never ``import ragflow_sdk`` directly,
    and :func:`sdk_is_current` where the generations' calls differ.
    """
    return ragflow_sdk(request.param)


def sdk_server_env(sdk: ModuleType) -> dict[str, str]:
    """The server settings an SDK generation needs: 0.22 reads ``GET /agents`` as a list."""
    return {} if sdk_is_current(sdk) else {"AGENTCANVAS_AGENT_LIST_SHAPE": "list"}


@pytest.fixture(scope="module", params=SDK_GENERATIONS, ids=lambda g: f"sdk{g}")
def module_sdk(request) -> ModuleType:
    """:func:`sdk` for a whole module, for modules whose tests share one server per generation."""
    return ragflow_sdk(request.param)


@pytest.fixture(scope="module", params=["sqlite", "mysql"])
def module_database_url(request, tmp_path_factory) -> Iterator[str]:
    """:func:`database_url` for a whole module (one server serving all its tests, each a tenant)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('module-db') / 'agentcanvas.db'}"
        return
    yield from throwaway_database(request.param, "agentcanvas_e2e")


@pytest.fixture
def rag(sdk, deployment):
    """A ``RAGFlow`` client of this generation on a new server (its own token).

    The server runs with :func:`sdk_server_env`. For another tenant's client on the same
    server: ``sdk.RAGFlow(api_key=deployment.token("other"), base_url=rag.api_url[:-7])``
    (``api_url`` ends in ``/api/v1``).
    """
    server = deployment.server(**sdk_server_env(sdk))
    return sdk.RAGFlow(api_key=deployment.token(), base_url=server.url)
