"""Turns over HTTP: ``agentcanvas serve`` against a floor app, side by side in one run.

Closed-loop keep-alive clients (1, 4, 16, 64 at once) each own a session and play
the intake sample's form turn: a blocking completion that pauses at the form, then
one that resumes it with the answers. The subjects, all started before the first
measurement and served with the same gunicorn settings (``--workers``/``--threads``):

* **ours**: ``agentcanvas serve`` (token check, turn service, canvas, commit);
* **floor**: ``bench/floor_app.py``, a bare Flask app doing one equivalent database
  transaction per request (read the 6 KB snapshot row, parse it, write it back with
  a version check, append two message rows) with the same driver;
* **floor+canvas** (``--floor-canvas``): the floor app with the intake canvas run in
  that transaction the plain way (``floor_app.py --canvas``: the snapshot loaded, the
  question or the form's answers run, the canvas dumped; no token, no cache of loaded
  canvases, no logs or metrics): a bare Flask service running this canvas. ours/floor
  counts the canvas's own run against ours; ours/floor+canvas does not;
* **langgraph**: ``langgraph dev`` running the same greet → interrupt → reply graph,
  where ``langgraph-cli[inmem]`` is installed: not in the ``bench`` extra, as its
  ``langgraph-api`` pins ``jsonschema-rs`` below what the ``test`` extra's schemathesis
  needs; install it in a virtual environment of its own and name its CLI with
  ``--langgraph`` (by default, a ``langgraph`` beside this Python). Measured with
  langgraph-api 0.16.7 (langgraph-runtime-inmem 0.36.7): a lone client's blocking run
  is answered about 1 s after it is sent, whatever the graph, so at 1 client its row
  measures that wait rather than the turn;

on SQLite, MariaDB and PostgreSQL. ours and floor are both served by ``api.cli.run_gunicorn``
(the same gthread workers, the same least-connections spreading of keep-alive connections
over the workers from ``api/connection_balance.py``), so the comparison is fair. How the
clients' connections sat on the workers is sampled in each cell at the end of its
warm-up (from /proc) and printed beside it, e.g. ``8/8`` per round: a ratio compares like
with like only where the splits match. Measurement is interleaved: each round runs every subject
at every concurrency for ``--seconds``, and the figures are medians over the rounds,
with their spread (min–max). A ratio is always of two subjects measured in the same
round, one right after the other. Each cell's latency is printed as its median (p50)
and its 99th percentile (p99): with many clients the writers wait, and how they wait
shows in the p99 (the floor's in SQLite's busy handler, which lets some through at once
and puts others to sleep; ours in the write lock's queue, one after the other).

    .venv/bin/python bench/http.py [--clients 1,4,16,64] [--rounds 5] [--seconds 3] [--no-mysql]
    .venv/bin/python bench/http.py --uncached  # also ours with the canvas cache off
    .venv/bin/python bench/http.py --floor-canvas  # also the floor running the canvas
    .venv/bin/python bench/http.py --langgraph /tmp/lg/bin/langgraph  # langgraph-cli[inmem] in a venv of its own
    .venv/bin/python bench/http.py --check     # CI: fail if ours/floor > 2x the recorded ratio
    .venv/bin/python bench/http.py --record    # measure and write bench/http_baseline.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from _path import BENCH, ROOT

sys.path.insert(0, os.path.join(BENCH, "support"))

from throwaway import mysql_database, postgres_database  # noqa: E402

ANSWERS = {"name": "Ann", "age": 41, "plan": "pro", "notes": "a short note"}
BASELINE = os.path.join(BENCH, "http_baseline.json")
#: Ours' setting for a session's transcript cap (16 MiB by default), high enough that no
#: run reaches it: it is not what is measured, and the floor has none. One client's
#: session passed the default after about 90,000 requests (a run of 15 rounds at 1
#: client), and every request after was a quick refusal.
NO_TRANSCRIPT_CAP = {"AGENTCANVAS_SESSION_MAX_TRANSCRIPT_BYTES": str(2**50)}
BIN = os.path.dirname(sys.executable)


def intake_dsl() -> dict:
    with open(os.path.join(ROOT, "samples", "intake_form.json"), encoding="utf-8") as fh:
        return json.load(fh)["dsl"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- a tiny HTTP client
def http_request(method: str, path: str, body: dict | None = None, headers: dict | None = None) -> bytes:
    """One HTTP/1.1 request as bytes (keep-alive, JSON body)."""
    payload = json.dumps(body).encode() if body is not None else b""
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(payload)}"]
    if body is not None:
        head.append("Content-Type: application/json")
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length, chunked = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    if not chunked:
        return status, await reader.readexactly(length)
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return status, body
        body += chunk[:-2]


def call_raw(
    port: int, method: str, path: str, body: dict | None = None, headers: dict | None = None
) -> tuple[int, bytes]:
    """A single request outside the measurement; ``(status, body)``."""

    async def go() -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(http_request(method, path, body, {**(headers or {}), "Connection": "close"}))
        await writer.drain()
        try:
            return await read_response(reader)
        finally:
            writer.close()

    return asyncio.run(go())


def call(port: int, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> dict:
    """A single request outside the measurement (set-up); the reply's JSON."""
    status, raw = call_raw(port, method, path, body, headers)
    if status >= 300:
        raise RuntimeError(f"{method} {path} answered {status}: {raw[:300]!r}")
    return json.loads(raw) if raw else {}


def wait_listening(port: int, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server on port {port} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {seconds} s")


# ---------------------------------------------------------------- the subjects
@dataclass
class Client:
    """One closed-loop client: its requests, played in a cycle across phases."""

    requests: list[bytes]
    next: int = 0


@dataclass
class Subject:
    name: str
    port: int = 0
    proc: subprocess.Popen | None = None
    clients: list[Client] = field(default_factory=list)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def create_token(env: dict, tenant: str, *extra: str) -> str:
    """A new token of ``tenant`` (``agentcanvas token create``; ``--embed`` in ``extra``
    for an embed token) in the database ``env`` names."""
    out = subprocess.run(
        [os.path.join(BIN, "agentcanvas"), "token", "create", "--tenant", tenant, *extra],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.strip().splitlines()[-1].split()[-1]


def start_ours(
    url: str, workers: int, threads: int, sessions: int, name: str = "ours", **settings: str
) -> Subject:
    env = {**os.environ, "AGENTCANVAS_DATABASE_URL": url, **NO_TRANSCRIPT_CAP, **settings}
    env.pop("AGENTCANVAS_ACCESS_LOG", None)
    cli = os.path.join(BIN, "agentcanvas")
    token = create_token(env, f"bench-{uuid.uuid4().hex[:6]}")
    subject = Subject(name, free_port())
    subject.proc = subprocess.Popen(
        [cli, "serve", "--port", str(subject.port), "--workers", str(workers), "--threads", str(threads)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_listening(subject.port, subject.proc)
    auth = {"Authorization": f"Bearer {token}"}
    title = f"intake-{uuid.uuid4().hex[:6]}"
    agent_id = call(subject.port, "POST", "/api/v1/agents", {"title": title, "dsl": intake_dsl()}, auth)[
        "data"
    ]["id"]
    path = f"/api/v1/agents/{agent_id}/completions"
    for _ in range(sessions):
        sid = call(subject.port, "POST", f"/api/v1/agents/{agent_id}/sessions", {}, auth)["data"]["id"]
        bodies = [{"question": "sign me up"}, {"inputs": ANSWERS}]
        subject.clients.append(
            Client(
                [http_request("POST", path, {"session_id": sid, "stream": False, **b}, auth) for b in bodies]
            )
        )
    return subject


def start_floor(
    url: str, workers: int, threads: int, sessions: int, tmp: str, canvas: bool = False
) -> Subject:
    """The floor app (``--canvas``: **floor+canvas**) on ``url``, its ``sessions`` rows made."""
    from agent.canvas import Canvas

    name = "floor+canvas" if canvas else "floor"
    snapshot = Canvas(intake_dsl())
    snapshot.reset()
    seed = os.path.join(tmp, f"{name}-seed-{uuid.uuid4().hex[:6]}.json")
    with open(seed, "w", encoding="utf-8") as fh:
        fh.write(str(snapshot))
    script = os.path.join(BENCH, "support", "floor_app.py")
    subprocess.run(
        [sys.executable, script, "--db", url, "--seed", seed, "--sessions", str(sessions)], check=True
    )
    subject = Subject(name, free_port())
    subject.proc = subprocess.Popen(
        [
            sys.executable,
            script,
            "--db",
            url,
            "--port",
            str(subject.port),
            "--workers",
            str(workers),
            "--threads",
            str(threads),
            *(["--canvas"] if canvas else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_listening(subject.port, subject.proc)
    for i in range(sessions):
        bodies = [{"question": "sign me up"}, {"inputs": ANSWERS}]
        subject.clients.append(
            Client(
                [http_request("POST", "/turn", {"session_id": f"s{i}", "stream": False, **b}) for b in bodies]
            )
        )
    return subject


def start_langgraph(cli: str, workers: int, sessions: int, tmp: str) -> Subject | None:
    if not os.path.exists(cli):
        return None
    folder = os.path.join(tmp, "langgraph")
    os.makedirs(folder, exist_ok=True)
    shutil.copy(os.path.join(BENCH, "support", "intake_graph.py"), folder)
    with open(os.path.join(folder, "langgraph.json"), "w", encoding="utf-8") as fh:
        json.dump({"dependencies": ["."], "graphs": {"intake": "./intake_graph.py:graph"}}, fh)
    subject = Subject("langgraph", free_port())
    env = {**os.environ, "N_JOBS_PER_WORKER": str(workers), "LANGGRAPH_RUNTIME_EDITION": "inmem"}
    subject.proc = subprocess.Popen(
        [cli, "dev", "--port", str(subject.port), "--no-browser", "--no-reload"],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(subject.port, subject.proc, 120)
        for _ in range(200):
            try:
                call(subject.port, "GET", "/ok")
                break
            except (OSError, RuntimeError):
                time.sleep(0.1)
        for _ in range(sessions):
            tid = call(subject.port, "POST", "/threads", {})["thread_id"]
            path = f"/threads/{tid}/runs/wait"
            bodies = [
                {"assistant_id": "intake", "input": {"query": "sign me up"}},
                {"assistant_id": "intake", "command": {"resume": ANSWERS}},
            ]
            subject.clients.append(Client([http_request("POST", path, b) for b in bodies]))
    except RuntimeError as exc:
        print(f"  langgraph dev did not start: {exc}", file=sys.stderr)
        subject.stop()
        return None
    return subject


# ---------------------------------------------------------------- measuring
@dataclass
class Phase:
    rps: float
    p50_ms: float
    p99_ms: float  # how the writers wait shows here (the module's docstring)
    errors: int
    split: tuple[int, ...] = ()  # the clients' connections held by each worker process


def _descendants(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
            children = [int(c) for c in fh.read().split()]
    except OSError:
        return []
    return [d for c in children for d in (c, *_descendants(c))]


def connections_per_worker(server_pid: int, port: int) -> tuple[int, ...]:
    """How many established connections to ``port`` each process of the server holds
    (its workers, or the server itself when it has none), most first. From /proc: the
    sockets' inodes in /proc/net/tcp*, against each process's file descriptors."""
    local = f":{port:04X}"
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as fh:
                for line in fh.readlines()[1:]:
                    cols = line.split()
                    if cols[1].endswith(local) and cols[3] == "01":  # 01: ESTABLISHED
                        inodes.add(cols[9])
        except OSError:
            continue
    counts = []
    for pid in _descendants(server_pid) or [server_pid]:
        held = 0
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                held += link.startswith("socket:[") and link[8:-1] in inodes
        except OSError:
            continue
        counts.append(held)
    return tuple(sorted(counts, reverse=True))


async def _client_loop(
    port: int, client: Client, t_start: float, t_end: float, out: list, errs: list
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            t0 = time.perf_counter()
            if t0 >= t_end:
                return
            writer.write(client.requests[client.next])
            await writer.drain()
            status, _ = await read_response(reader)
            t1 = time.perf_counter()
            if status != 200:
                errs.append(status)
            else:
                client.next = (client.next + 1) % len(client.requests)
            if t0 >= t_start and t1 <= t_end:
                out.append(t1 - t0)
    finally:
        writer.close()


def measure(subject: Subject, clients: int, seconds: float, warmup: float) -> Phase:
    """Run ``clients`` closed-loop clients for ``warmup + seconds``; count the last ``seconds``."""

    split: list[tuple[int, ...]] = []

    async def sample_split() -> None:
        # Once the clients are connected (the end of the warm-up), off the event loop.
        await asyncio.sleep(warmup)
        split.append(
            await asyncio.get_running_loop().run_in_executor(
                None, connections_per_worker, subject.proc.pid, subject.port
            )
        )

    async def go() -> tuple[list, list]:
        now = time.perf_counter()
        t_start, t_end = now + warmup, now + warmup + seconds
        out: list[float] = []
        errs: list[int] = []
        await asyncio.gather(
            *(_client_loop(subject.port, c, t_start, t_end, out, errs) for c in subject.clients[:clients]),
            sample_split(),
        )
        return out, errs

    latencies, errors = asyncio.run(go())
    return Phase(
        rps=len(latencies) / seconds,
        p50_ms=statistics.median(latencies) * 1000 if latencies else float("nan"),
        p99_ms=statistics.quantiles(latencies, n=100)[98] * 1000 if len(latencies) > 1 else float("nan"),
        errors=len(errors),
        split=split[0],
    )


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    if not values:
        return "- (no round without errors)"
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}–{fmt.format(max(values))}]"


def cost_ratios(of: list[Phase], to: list[Phase]) -> list[float]:
    """The cost per request of ``of`` over that of ``to`` (``to``'s requests/s over
    ``of``'s), round by round, leaving out a round where either answered an error: an
    error is a quick refusal, and such a round measures that."""
    return [
        t.rps / o.rps if o.rps else float("inf")
        for o, t in zip(of, to, strict=True)
        if not (o.errors or t.errors)
    ]


def run(args: argparse.Namespace) -> tuple[dict[str, dict[int, list[float]]], int]:
    """Measure; print the tables; return ``({backend: {clients: [ours/floor per round]}}, errors)``,
    ``errors`` the requests answered with an error, all subjects and rounds together."""
    levels = [int(c) for c in args.clients.split(",")]
    sessions = max(levels)
    tmp = tempfile.mkdtemp(prefix="agentcanvas-bench-http-")
    cleanups: list = []
    subjects: dict[str, list[Subject]] = {}
    try:
        backends = [("sqlite", lambda who: f"sqlite:///{tmp}/{who}.db")]
        if not args.no_mysql:

            def mysql_url(who: str) -> str:
                url, drop = mysql_database()
                cleanups.append(drop)
                return url

            backends.append(("mariadb", mysql_url))
        if not args.no_postgres:

            def postgres_url(who: str) -> str:
                url, drop = postgres_database()
                cleanups.append(drop)
                return url

            backends.append(("postgres", postgres_url))
        # Started side by side (each start waits for a server to load): a shorter run.
        with ThreadPoolExecutor(4) as pool:
            starting = {
                backend: [
                    pool.submit(start_ours, url_for("ours"), args.workers, args.threads, sessions),
                    pool.submit(start_floor, url_for("floor"), args.workers, args.threads, sessions, tmp),
                ]
                + (
                    # ours with the canvas cache off (api/services/canvas_cache.py), to compare
                    [
                        pool.submit(
                            start_ours,
                            url_for("uncached"),
                            args.workers,
                            args.threads,
                            sessions,
                            "uncached",
                            AGENTCANVAS_SERVER_CANVAS_CACHE_ENTRIES="0",
                        )
                    ]
                    if args.uncached
                    else []
                )
                + (
                    [
                        pool.submit(
                            start_floor, url_for("floorc"), args.workers, args.threads, sessions, tmp, True
                        )
                    ]
                    if args.floor_canvas
                    else []
                )
                for backend, url_for in backends
            }
            lg_future = (
                None
                if args.no_langgraph
                else pool.submit(start_langgraph, args.langgraph, args.workers, sessions, tmp)
            )
            failure = None
            for backend, futures in starting.items():
                for future in futures:
                    try:
                        subjects.setdefault(backend, []).append(future.result())
                    except Exception as exc:  # noqa: BLE001 - the others are stopped, then it is raised
                        failure = failure or exc
            if lg_future is not None:
                lg = lg_future.result()
                if lg is not None:
                    subjects["sqlite"].append(lg)  # in memory: listed once, beside the SQLite rows
                else:
                    print(
                        f"  no langgraph CLI at {args.langgraph} (langgraph-cli[inmem], see --help): left out",
                        file=sys.stderr,
                    )
            if failure is not None:
                raise failure
        results: dict[tuple[str, str, int], list[Phase]] = {}
        for r in range(args.rounds):
            for backend, group in subjects.items():
                for level in levels:
                    for subject in group:
                        phase = measure(subject, level, args.seconds, args.warmup)
                        results.setdefault((backend, subject.name, level), []).append(phase)
            print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr)
        for backend, group in subjects.items():
            if group[0].name == "ours":
                print(f"  {backend}: ours' canvas cache {cache_counts(group[0].port)}", file=sys.stderr)
    finally:
        for group in subjects.values():
            for subject in group:
                subject.stop()
        for drop in cleanups:
            drop()
        shutil.rmtree(tmp, ignore_errors=True)

    ratios: dict[str, dict[int, list[float]]] = {}
    print(
        f"\nturns over HTTP: {args.workers} workers x {args.threads} threads each, {args.rounds} rounds of "
        f"{args.seconds:g} s per cell, interleaved; median [min–max] over rounds"
    )
    print(
        f"{'backend':<9}{'clients':>8}  {'subject':<13}{'requests/s':>22}{'p50 ms':>24}{'p99 ms':>26}{'errors':>8}"
        "  connections per worker, each round"
    )
    for backend, group in subjects.items():
        for level in levels:
            for subject in group:
                phases = results[(backend, subject.name, level)]
                print(
                    f"{backend:<9}{level:>8}  {subject.name:<13}{spread([p.rps for p in phases]):>22}"
                    f"{spread([p.p50_ms for p in phases], '{:.2f}'):>24}"
                    f"{spread([p.p99_ms for p in phases], '{:.2f}'):>26}{sum(p.errors for p in phases):>8}"
                    f"  {' '.join('/'.join(map(str, p.split)) for p in phases)}"
                )
    print("\ncost per request, ratio of two subjects measured in the same round: median [min–max]")
    for backend, group in subjects.items():
        names = [s.name for s in group]
        for level in levels:
            ours = results[(backend, "ours", level)]
            per_round = cost_ratios(ours, results[(backend, "floor", level)])
            ratios.setdefault(backend, {})[level] = per_round
            line = f"  {backend:<8}{level:>3} clients  ours/floor {spread(per_round, '{:.2f}')}"
            if "floor+canvas" in names:
                vs = cost_ratios(ours, results[(backend, "floor+canvas", level)])
                line += f"   ours/floor+canvas {spread(vs, '{:.2f}')}"
            for other in ("uncached", "langgraph"):  # their cost over ours'
                if other in names:
                    vs = cost_ratios(results[(backend, other, level)], ours)
                    line += f"   {other}/ours {spread(vs, '{:.2f}')}"
            print(line)
    errors = sum(p.errors for phases in results.values() for p in phases)
    if errors:
        print(
            f"\n{errors} requests were answered with an error (the errors column): the ratios leave "
            "out the rounds they fell in",
            file=sys.stderr,
        )
    return ratios, errors


def cache_counts(port: int) -> str:
    """The canvas cache's hits and misses over the whole run, from ``/metrics``."""
    counts = {"hit": 0.0, "miss": 0.0}
    try:
        status, raw = call_raw(port, "GET", "/metrics")
    except OSError as exc:
        return f"(no /metrics: {exc})"
    text = raw.decode()
    for line in text.splitlines():
        if line.startswith("agentcanvas_canvas_cache_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            counts[outcome] = counts.get(outcome, 0) + float(line.rsplit(" ", 1)[1])
    total = counts["hit"] + counts["miss"]
    rate = f"{100 * counts['hit'] / total:.1f}%" if total else "-"
    return f"hits {counts['hit']:.0f}, misses {counts['miss']:.0f} (hit rate {rate})"


def check(ratios: dict[str, dict[int, list[float]]], record: bool) -> int:
    measured = {
        b: {str(c): round(statistics.median(v), 3) for c, v in by.items() if v} for b, by in ratios.items()
    }
    if record:
        with open(BASELINE, "w", encoding="utf-8") as fh:
            json.dump(measured, fh, indent=2)
            fh.write("\n")
        print(f"recorded {BASELINE}: {measured}")
        return 0
    with open(BASELINE, encoding="utf-8") as fh:
        recorded = json.load(fh)
    failed = []
    for backend, by in measured.items():
        for level, ratio in by.items():
            base = (recorded.get(backend) or {}).get(level)
            if base is None:
                continue
            verdict = "ok" if ratio <= 2 * base else "TOO SLOW"
            print(
                f"  {backend} {level} clients: ours/floor {ratio:.2f} (recorded {base:.2f}, limit {2 * base:.2f}) {verdict}"
            )
            if ratio > 2 * base:
                failed.append(f"{backend}@{level}")
    if failed:
        print(f"ours/floor is more than twice the recorded ratio at {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", default="1,4,16,64")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--no-mysql", action="store_true")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-langgraph", action="store_true")
    parser.add_argument(
        "--langgraph",
        default=os.path.join(BIN, "langgraph"),
        help="the langgraph CLI of langgraph-cli[inmem] (best in a virtual environment of its own)",
    )
    parser.add_argument(
        "--uncached", action="store_true", help="also measure ours with the canvas cache off ('uncached')"
    )
    parser.add_argument(
        "--floor-canvas",
        action="store_true",
        help="also measure the floor with the canvas run in its transaction ('floor+canvas')",
    )
    parser.add_argument("--check", action="store_true", help="short run; fail if ours/floor > 2x the record")
    parser.add_argument("--record", action="store_true", help="write the measured ratios as the record")
    args = parser.parse_args()
    if args.check or args.record:  # the record is taken the way the check measures
        args.clients, args.rounds, args.seconds, args.warmup = "1,16", 3, 1.5, 0.3
        args.no_mysql = args.no_postgres = args.no_langgraph = True
        args.floor_canvas = False
    ratios, errors = run(args)
    if errors and args.record:
        print("nothing recorded: a run with errors measures no turn", file=sys.stderr)
        return 1
    if args.check or args.record:
        return check(ratios, args.record) or (1 if errors else 0)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
