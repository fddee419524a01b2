"""Knowledge-base search measured side by side in one run, on a corpus a package ships.

The corpus is Debian's ``python3.11-doc`` (installed with ``apt-get`` when missing):
its HTML pages for the whole parse pipeline, its reStructuredText sources
(``_sources/*.rst.txt``, the same documentation as text) for the larger indexes.

1. **Indexing throughput**: HTML pages uploaded to a dataset and parsed by the real
   parse task (docparse → naive chunking → chunks and full-text entries stored), in
   chunks per second, on SQLite and MariaDB.
2. **Query latency** at 1k, 10k and 100k chunks on SQLite and MariaDB: the search
   ``POST /retrieval`` runs (the full-text index, BM25 over the candidates, the chunk
   rows), in process, p50 and p99 over the same queries; beside it **bm25s** on the
   same chunks and the same tokens (``agent.search_tokens.tokenize``), its latency and
   the **top-10 agreement** (mean share of bm25s's top 10 that ours also returns).
3. **A chat turn while a 500-page PDF is parsed**: a real ``agentcanvas serve`` (one
   worker, ``datasets.parse_threads`` 1) answers a Retrieval + LLM agent (LLM: the test
   server); the median blocking turn on the idle server, then while the upload is
   being parsed, and their ratio.

    .venv/bin/pip install -e '.[bench]'       # bm25s
    .venv/bin/python bench/retrieval.py [--sizes 1000,10000,100000] [--queries 100] [--no-mysql]
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from _path import ROOT

HTML = "/usr/share/doc/python3.11/html"
SOURCES = os.path.join(HTML, "_sources")
MYSQL_URL = "mysql://root@127.0.0.1:3306/{name}"
BIN = os.path.dirname(sys.executable)


def ensure_corpus() -> None:
    if os.path.isdir(SOURCES):
        return
    print("installing Debian's python3.11-doc (the corpus) with apt-get ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "install", "-y", "-qq", "python3.11-doc"], check=True, env=env)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# ---------------------------------------------------------------------- in-process set-up
def open_app(url: str):
    from api import create_app
    from api.services import tokens

    app = create_app({"DATABASE_URL": url, "DATASETS": {"parse_threads": 0, "max_chunks_per_dataset": 10**7}})
    with app.app_context():
        tenant = tokens.tenant_by_name("bench")
    return app, tenant.id


def drop_mysql(name: str) -> None:
    from peewee import MySQLDatabase

    admin = MySQLDatabase("information_schema", host="127.0.0.1", port=3306, user="root")
    with admin.connection_context():
        admin.execute_sql(f"DROP DATABASE IF EXISTS `{name}`")


def throughput(url: str, pages: int) -> tuple[int, float]:
    """HTML pages through the whole parse task; ``(chunks, seconds)``."""
    from api.db import db
    from api.services import datasets, parsing

    app, tenant = open_app(url)
    workers = app.extensions["agentcanvas.parsing"]
    files = sorted(glob.glob(os.path.join(HTML, "**", "*.html"), recursive=True))[:pages]
    with db.connection_context():
        ds = datasets.create_dataset(
            tenant, {"name": "python docs", "parser_config": {"chunk_token_num": 128}}
        )
        limits = datasets.KnowledgeLimits(max_files_per_request=10**6, max_chunks_per_dataset=10**7)
        docs = datasets.upload_documents(
            tenant, ds.id, [(os.path.basename(f), open(f, "rb").read()) for f in files], limits
        )
        parsing.start_parsing(tenant, ds.id, [d.id for d in docs])
        started = time.perf_counter()
        while True:
            claimed = workers._claim_next()
            if claimed is None:
                break
            workers.run_task(*claimed)
        seconds = time.perf_counter() - started
        chunks = sum(
            d.chunk_count for d in datasets.Document.select().where(datasets.Document.dataset_id == ds.id)
        )
    workers.stop()
    return chunks, seconds


def corpus_chunks(target: int) -> list[str]:
    """At least ``target`` distinct chunks of the rst sources (smaller chunks if needed)."""
    from agent.chunking import naive_chunks

    texts = [
        open(f, encoding="utf-8", errors="replace").read()
        for f in sorted(glob.glob(f"{SOURCES}/**/*.txt", recursive=True))
    ]
    out: list[str] = []
    seen: set[str] = set()
    for size in (48, 32, 24, 64, 40):
        for text in texts:
            for chunk in naive_chunks([text], size, "\n"):
                if chunk not in seen:
                    seen.add(chunk)
                    out.append(chunk)
        if len(out) >= target:
            break
    random.Random(7).shuffle(out)
    return out[:target]


def load_chunks(tenant: str, ds_id: str, doc_id: str, texts: list[str], start: int) -> None:
    """Store chunks as the parse task does (rows and full-text entries, in batches)."""
    from agent.chunking import token_count
    from api.db import write_transaction
    from api.db.database import insert_rows
    from api.db.models import now_ms
    from api.services.datasets import CHUNKS
    from api.services.parsing import _CHUNK_COLUMNS

    now = now_ms()
    for b in range(0, len(texts), 500):
        rows = [
            (
                f"c{start + b + i:08d}",
                ds_id,
                doc_id,
                start + b + i,
                t,
                "[]",
                "[]",
                True,
                token_count(t),
                None,
                now,
                now,
            )
            for i, t in enumerate(texts[b : b + 500])
        ]
        with write_transaction():
            insert_rows("chunk", _CHUNK_COLUMNS, rows)
            CHUNKS.add(ds_id, [(r[0], r[4]) for r in rows])


def make_queries(texts: list[str], n: int) -> list[str]:
    from agent.search_tokens import tokenize

    rng = random.Random(11)
    queries = []
    while len(queries) < n:
        words = [w for w in tokenize(rng.choice(texts)) if w.isalpha() and len(w) >= 3]
        if len(words) >= 3:
            queries.append(" ".join(rng.sample(words, 3)))
    return queries


def scale(url: str, sizes: list[int], queries_n: int, texts: list[str]) -> list[dict]:
    import bm25s

    from agent.search_tokens import query_terms, tokenize
    from api.db import Dataset, Document, db
    from api.services.retrieval import Retriever

    app, tenant = open_app(url)
    rows = []
    with db.connection_context():
        ds = Dataset.create(tenant_id=tenant, name="scale")
        doc = Document.create(
            tenant_id=tenant, dataset_id=ds.id, name="python-docs.txt", type="txt", run="DONE"
        )
        retriever = Retriever(tenant)
        loaded = 0
        for size in sizes:
            t0 = time.perf_counter()
            load_chunks(tenant, ds.id, doc.id, texts[loaded:size], loaded)
            load_seconds = time.perf_counter() - t0
            added = size - loaded
            loaded = size
            corpus = texts[:size]
            queries = make_queries(corpus, queries_n)
            reference = bm25s.BM25(k1=1.2, b=0.75, method="lucene")
            reference.index([tokenize(t) for t in corpus], show_progress=False)
            ours_ms, theirs_ms, overlap = [], [], []
            for q in queries:
                t = time.perf_counter()
                found = retriever.search([ds.id], q, page_size=10, similarity_threshold=0.0, top_k=1024)
                ours_ms.append((time.perf_counter() - t) * 1000)
                mine = {c["id"] for c in found["chunks"]}
                t = time.perf_counter()
                docs, scores = reference.retrieve([query_terms(q)], k=10, show_progress=False)
                theirs_ms.append((time.perf_counter() - t) * 1000)
                theirs = {f"c{int(i):08d}" for i, s in zip(docs[0], scores[0], strict=True) if s > 0}
                if theirs:
                    overlap.append(len(mine & theirs) / len(theirs))
            rows.append(
                {
                    "chunks": size,
                    "load_cps": added / load_seconds,
                    "p50": statistics.median(ours_ms),
                    "p99": pct(ours_ms, 0.99),
                    "bm25s_p50": statistics.median(theirs_ms),
                    "agreement": statistics.mean(overlap) if overlap else float("nan"),
                }
            )
            print(
                f"  {size:>7} chunks: p50 {rows[-1]['p50']:.1f} ms, agreement {rows[-1]['agreement']:.3f}",
                flush=True,
            )
    app.extensions["agentcanvas.parsing"].stop()
    return rows


# ---------------------------------------------------------------------- a turn under parsing
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def turn_under_parsing(turns: int) -> tuple[float, float, int]:
    """Median blocking turn (ms) idle and while a 500-page PDF is parsed; turns measured busy."""
    import requests

    from tests.files import make_pdf
    from tests.llm_server import LLMServer

    work = tempfile.mkdtemp(prefix="bench-retrieval-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTCANVAS_")}
    with LLMServer() as llm:
        env.update(
            AGENTCANVAS_DATABASE_URL=f"sqlite:///{work}/db.sqlite",
            AGENTCANVAS_LLM_BASE_URL=llm.url,
            AGENTCANVAS_LLM_API_KEY="test",
            AGENTCANVAS_LLM_MODEL=llm.model,
            AGENTCANVAS_DATASETS_PARSE_THREADS="1",
        )
        token = subprocess.run(
            [f"{BIN}/agentcanvas", "token", "create", "--tenant", "bench"],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[-1]
        port = free_port()
        server = subprocess.Popen(
            [f"{BIN}/agentcanvas", "serve", "--port", str(port), "--workers", "1", "--threads", "8"],
            env=env,
            cwd=work,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            base = f"http://127.0.0.1:{port}/api/v1"
            http = requests.Session()
            http.headers["Authorization"] = f"Bearer {token}"
            for _ in range(600):
                try:
                    http.get(f"{base}/datasets", timeout=2)
                    break
                except requests.RequestException:
                    time.sleep(0.1)
            ds = http.post(f"{base}/datasets", json={"name": "faq"}).json()["data"]["id"]
            faq = "\n".join(
                open(f, encoding="utf-8").read() for f in sorted(glob.glob(f"{SOURCES}/faq/*.txt"))[:3]
            )
            doc = http.post(
                f"{base}/datasets/{ds}/documents", files={"file": ("faq.txt", faq.encode())}
            ).json()["data"][0]["id"]
            http.post(f"{base}/datasets/{ds}/chunks", json={"document_ids": [doc]})
            while http.get(f"{base}/datasets/{ds}/documents").json()["data"]["docs"][0]["run"] != "DONE":
                time.sleep(0.1)
            sys.path.insert(0, ROOT)
            from tests.api.conftest import dsl_of

            dsl = dsl_of(
                {
                    "Retrieval:Find": ("Retrieval", {"kb_ids": [ds]}, ["LLM:Answer"]),
                    "LLM:Answer": (
                        "LLM",
                        {"sys_prompt": "{Retrieval:Find@formalized_content}"},
                        ["Message:Out"],
                    ),
                    "Message:Out": ("Message", {"content": ["{LLM:Answer@content}"]}, []),
                }
            )
            agent = http.post(f"{base}/agents", json={"title": "faq", "dsl": dsl}).json()["data"]["id"]
            session = http.post(f"{base}/agents/{agent}/sessions", json={}).json()["data"]["id"]

            def turn() -> float:
                t = time.perf_counter()
                resp = http.post(
                    f"{base}/agents/{agent}/completions",
                    json={
                        "question": "How do I install Python packages?",
                        "stream": False,
                        "session_id": session,
                    },
                )
                assert resp.status_code == 200, resp.text
                return (time.perf_counter() - t) * 1000

            for _ in range(3):
                turn()
            idle = [turn() for _ in range(turns)]
            texts = [open(f, encoding="utf-8").read() for f in sorted(glob.glob(f"{SOURCES}/library/*.txt"))]
            pages = []
            for text in texts:
                lines = [
                    ln.encode("latin-1", "replace").decode("latin-1")
                    for ln in text.splitlines()
                    if ln.strip()
                ]
                for i in range(0, len(lines), 40):
                    pages.append("\n".join(lines[i : i + 40]))
                    if len(pages) == 500:
                        break
                if len(pages) == 500:
                    break
            pdf = make_pdf(pages)
            big = http.post(f"{base}/datasets/{ds}/documents", files={"file": ("library.pdf", pdf)}).json()[
                "data"
            ][0]["id"]
            http.post(f"{base}/datasets/{ds}/chunks", json={"document_ids": [big]})
            busy = []
            while True:
                state = next(
                    d
                    for d in http.get(f"{base}/datasets/{ds}/documents").json()["data"]["docs"]
                    if d["id"] == big
                )
                if state["run"] != "RUNNING":
                    break
                busy.append(turn())
        finally:
            os.killpg(server.pid, 15)
            server.wait(30)
            shutil.rmtree(work, ignore_errors=True)
    return statistics.median(idle), statistics.median(busy) if busy else float("nan"), len(busy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--pages", type=int, default=40, help="HTML pages for the throughput run")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--no-mysql", action="store_true")
    args = parser.parse_args()
    ensure_corpus()
    sizes = [int(s) for s in args.sizes.split(",")]
    backends = [("SQLite", None)] + (
        [] if args.no_mysql else [("MariaDB", f"bench_retrieval_{uuid.uuid4().hex[:8]}")]
    )

    print("1. indexing throughput (HTML pages through the parse task)", flush=True)
    through = {}
    for label, mysql in backends:
        tmp = tempfile.mkdtemp()
        url = f"sqlite:///{tmp}/t.db" if mysql is None else MYSQL_URL.format(name=mysql + "_t")
        try:
            through[label] = throughput(url, args.pages)
        finally:
            if mysql:
                drop_mysql(mysql + "_t")
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"  {label}: {through[label][0]} chunks in {through[label][1]:.1f} s", flush=True)

    print("2. query latency and agreement with bm25s", flush=True)
    texts = corpus_chunks(max(sizes))
    results = {}
    for label, mysql in backends:
        tmp = tempfile.mkdtemp()
        url = f"sqlite:///{tmp}/s.db" if mysql is None else MYSQL_URL.format(name=mysql)
        try:
            print(f" {label}", flush=True)
            results[label] = scale(url, sizes, args.queries, texts)
        finally:
            if mysql:
                drop_mysql(mysql)
            shutil.rmtree(tmp, ignore_errors=True)

    print("3. a chat turn while a 500-page PDF is parsed (SQLite, one worker)", flush=True)
    idle, busy, n = turn_under_parsing(args.turns)

    print()
    print("| backend | indexing (HTML → chunks, whole pipeline) |")
    print("|---|---|")
    for label, (chunks, seconds) in through.items():
        print(
            f"| {label} | {chunks / seconds:,.0f} chunks/s ({chunks} chunks of {args.pages} pages in {seconds:.1f} s) |"
        )
    print()
    print(
        "| backend | chunks | query p50 | query p99 | bm25s p50 | ours / bm25s (p50) | top-10 agreement | bulk load |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, rows in results.items():
        for r in rows:
            print(
                f"| {label} | {r['chunks']:,} | {r['p50']:.1f} ms | {r['p99']:.1f} ms | {r['bm25s_p50']:.2f} ms "
                f"| {r['p50'] / r['bm25s_p50']:.0f}x | {r['agreement']:.3f} | {r['load_cps']:,.0f} chunks/s |"
            )
    print()
    print("| chat turn (Retrieval + LLM, blocking) | median |")
    print("|---|---|")
    print(f"| idle server | {idle:.1f} ms |")
    print(f"| while a 500-page PDF is parsed ({n} turns) | {busy:.1f} ms |")
    print(f"| ratio (goal ≤ 1.5x) | {busy / idle:.2f}x |")


if __name__ == "__main__":
    main()
