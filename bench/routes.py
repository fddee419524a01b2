"""Every completion route over HTTP, against ``POST /api/v1/agents/<id>/completions``.

One ``agentcanvas serve`` on SQLite, or with ``--backend mysql``/``postgres`` on a
throwaway database of the local MariaDB or PostgreSQL (``--workers``/``--threads`` as in bench/http.py),
one keep-alive client at a time, the intake sample's form turn (a question that pauses
at the form, then the answers that resume it) played on each route:

* **agents**: ``/agents/<id>/completions``, blocking: the reference every row is divided by;
* **agents, streamed**: the same route with ``stream: true``;
* **chat**: ``/agents/chat/completions`` (the agent id in the body), blocking;
* **openai** / **openai, streamed**: ``/agents_openai/<id>/chat/completions``;
* **embed** / **embed, streamed**: ``/agentbots/<id>/completions`` with an embed token
  and a visitor's ``user_id``;
* **… first message**: the question without a session id, on the agents, openai and
  embed routes: each request makes a new session (which then waits at the form);
* **create session**: ``POST /agents/<id>/sessions``.

A route that costs much more than the reference does work the reference does not, and
is where to look next. Measurement is interleaved: each round runs every route for
``--seconds`` (after ``--warmup``), and a ratio is of two routes measured in the same
round; the figures are medians over the rounds, with their spread (min–max).

    .venv/bin/python bench/routes.py [--rounds 5] [--seconds 2] [--backend sqlite|mysql|postgres]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import uuid

from _path import BENCH, load_bench

sys.path.insert(0, os.path.join(BENCH, "support"))

from throwaway import mysql_database, postgres_database  # noqa: E402

bench_http = load_bench("http")

ANSWERS = bench_http.ANSWERS
Client, Subject = bench_http.Client, bench_http.Subject
call, http_request = bench_http.call, bench_http.http_request


def start(url: str, workers: int, threads: int) -> tuple[subprocess.Popen, list[Subject]]:
    """The server on the database at ``url``, and one subject per route (each with its own sessions)."""
    env = {**os.environ, "AGENTCANVAS_DATABASE_URL": url}
    env.pop("AGENTCANVAS_ACCESS_LOG", None)
    cli = os.path.join(bench_http.BIN, "agentcanvas")
    tenant = f"bench-{uuid.uuid4().hex[:6]}"
    api = {"Authorization": f"Bearer {bench_http.create_token(env, tenant)}"}
    embed = {"Authorization": f"Bearer {bench_http.create_token(env, tenant, '--embed')}"}
    port = bench_http.free_port()
    proc = subprocess.Popen(
        [cli, "serve", "--port", str(port), "--workers", str(workers), "--threads", str(threads)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    bench_http.wait_listening(port, proc)
    agent = call(port, "POST", "/api/v1/agents", {"title": "intake", "dsl": bench_http.intake_dsl()}, api)[
        "data"
    ]["id"]

    def session() -> str:
        return call(port, "POST", f"/api/v1/agents/{agent}/sessions", {}, api)["data"]["id"]

    visitor = secrets.token_hex(16)
    bot_path = f"/api/v1/agentbots/{agent}/completions"

    def embed_session() -> str:
        """A visitor's session, opened by a question and its form answered: ready for
        the cycle (question, answers) as the others are."""
        sid = call(port, "POST", bot_path, {"question": "hi", "user_id": visitor, "stream": False}, embed)
        sid = sid["data"]["session_id"]
        answers = {"session_id": sid, "inputs": ANSWERS, "user_id": visitor, "stream": False}
        call(port, "POST", bot_path, answers, embed)
        return sid

    def cycle(path: str, bodies: list[dict], headers: dict) -> Client:
        return Client([http_request("POST", path, b, headers) for b in bodies])

    def form(sid: str | None, extra: dict) -> list[dict]:
        return [
            {"session_id": sid, "question": "sign me up", **extra},
            {"session_id": sid, "inputs": ANSWERS, **extra},
        ]

    def openai(sid: str | None, stream: bool) -> list[dict]:
        ask = {"messages": [{"role": "user", "content": "sign me up"}], "stream": stream}
        if sid is None:
            return [ask]
        return [{**ask, "session_id": sid}, {**ask, "session_id": sid, "inputs": ANSWERS}]

    agents_path = f"/api/v1/agents/{agent}/completions"
    openai_path = f"/api/v1/agents_openai/{agent}/chat/completions"
    routes = {
        "agents": cycle(agents_path, form(session(), {"stream": False}), api),
        "agents, streamed": cycle(agents_path, form(session(), {"stream": True}), api),
        "chat": cycle(
            "/api/v1/agents/chat/completions", form(session(), {"stream": False, "agent_id": agent}), api
        ),
        "openai": cycle(openai_path, openai(session(), False), api),
        "openai, streamed": cycle(openai_path, openai(session(), True), api),
        "embed": cycle(bot_path, form(embed_session(), {"stream": False, "user_id": visitor}), embed),
        "embed, streamed": cycle(
            bot_path, form(embed_session(), {"stream": True, "user_id": visitor}), embed
        ),
        "agents first message": cycle(agents_path, [{"question": "sign me up", "stream": False}], api),
        "openai first message": cycle(openai_path, openai(None, False), api),
        "embed first message": cycle(
            bot_path, [{"question": "sign me up", "stream": False, "user_id": visitor}], embed
        ),
        "create session": cycle(f"/api/v1/agents/{agent}/sessions", [{}], api),
    }
    subjects = []
    for name, client in routes.items():
        subject = Subject(name, port, proc)
        subject.clients.append(client)
        subjects.append(subject)
    return proc, subjects


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--warmup", type=float, default=0.3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--backend", choices=("sqlite", "mysql", "postgres"), default="sqlite")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="agentcanvas-bench-routes-")
    url, drop = f"sqlite:///{tmp}/routes.db", None
    if args.backend == "mysql":
        url, drop = mysql_database()
    elif args.backend == "postgres":
        url, drop = postgres_database()
    proc = None
    try:
        proc, subjects = start(url, args.workers, args.threads)
        results: dict[str, list] = {s.name: [] for s in subjects}
        for r in range(args.rounds):
            for subject in subjects:
                results[subject.name].append(bench_http.measure(subject, 1, args.seconds, args.warmup))
            print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
        if drop is not None:
            drop()

    spread = bench_http.spread
    reference = results["agents"]
    print(
        f"\ncompletion routes over HTTP, 1 client, {args.backend}, {args.workers} workers x {args.threads} threads, "
        f"{args.rounds} rounds of {args.seconds:g} s, interleaved; median [min–max] over rounds"
    )
    print(f"{'route':<24}{'requests/s':>20}{'p50 ms':>22}{'errors':>8}{'cost / agents':>24}")
    for name, phases in results.items():
        ratio = [a.rps / p.rps if p.rps else float("inf") for a, p in zip(reference, phases, strict=True)]
        print(
            f"{name:<24}{spread([p.rps for p in phases]):>20}{spread([p.p50_ms for p in phases], '{:.2f}'):>22}"
            f"{sum(p.errors for p in phases):>8}{spread(ratio, '{:.2f}'):>24}"
        )
    return 1 if any(p.errors for phases in results.values() for p in phases) else 0


if __name__ == "__main__":
    sys.exit(main())
