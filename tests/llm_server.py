"""A small OpenAI-compatible chat server for tests and for trying the LLM samples.

    with LLMServer() as server:               # 127.0.0.1, a free port, in a thread
        server.queue(text("Hello!"), tool_call("lookup", {"q": "x"}), error(429))
        canvas = Canvas(dsl, services={"llm_settings": server.settings()})
        ...
        server.requests[-1]["body"]["messages"]   # exactly what was sent

Routes: ``POST /v1/chat/completions`` (streamed as real SSE ``data: {...}`` chunks
ending in ``data: [DONE]``, or whole), ``POST /v1/embeddings`` (deterministic
vectors: each word of the text is hashed into one of :data:`EMBEDDING_DIMENSIONS`
dimensions, then the vector is normalised, so texts sharing words are close),
``GET /v1/models``. Each request takes the
next queued :class:`Reply`; with the queue empty the default rule answers:

* a request with a JSON-schema ``response_format`` gets a JSON value of that schema;
* a classification request (a system prompt listing ``Categories:`` as
  ``- name: ...`` lines, as the Categorize component writes it) gets the category
  whose name or examples share the most words with the user's message;
* a request offering a retrieval tool (a function whose name has ``retrieval`` or
  ``search``) that has no tool result yet gets a call of it with the user's message
  as ``query``;
* a request holding knowledge blocks (``ID: n`` … ``Content:``, as the Retrieval
  component writes them, in any message) gets the sentence (or line) of the block
  that shares most words with the user's message, cited as ``[ID:n]``;
* anything else gets ``"echo: <the last user message>"``.

Usage numbers are word counts (prompt: all message contents; completion: the reply).
Failures can be injected per reply: an HTTP status (429, 500, with ``Retry-After``),
a delay before answering (to trip the client's timeout), a stall or a dropped
connection in the middle of a stream.

By hand: ``python -m tests.llm_server --port 8090`` prints how to point agentcanvas
at it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_MODEL = "test-model"
EMBEDDING_DIMENSIONS = 64
API_KEY = "sk-test-0123456789abcdef"


@dataclass
class Reply:
    """One scripted answer.

    Attributes:
        content: the answer text.
        tool_calls: ``[{"name", "arguments"}]`` (arguments a dict or JSON text).
        status: an HTTP error status to answer with instead (429, 500...).
        error: the error message for ``status``.
        headers: extra response headers (``{"retry-after-ms": "10"}``).
        delay: seconds to wait before answering.
        chunks: how to split ``content`` when streamed (default: word by word).
        stall_after: when streamed, wait ``stall`` seconds after this many chunks.
        stall: see ``stall_after``.
        drop_after: when streamed, close the connection after this many chunks.
        usage: usage to report instead of the word counts.
        no_usage: report no usage at all (as some servers do).
    """

    content: str | None = None
    tool_calls: list[dict] = field(default_factory=list)
    status: int = 200
    error: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    chunks: list[str] | None = None
    stall_after: int | None = None
    stall: float = 0.0
    drop_after: int | None = None
    usage: dict | None = None
    no_usage: bool = False


def text(content: str, **kwargs: Any) -> Reply:
    """An answer with this text."""
    return Reply(content=content, **kwargs)


def tool_call(
    name: str, arguments: dict | str | None = None, *more: tuple[str, dict], **kwargs: Any
) -> Reply:
    """An answer asking for one tool call (``more``: further ``(name, arguments)`` calls)."""
    calls = [{"name": name, "arguments": arguments or {}}]
    calls += [{"name": n, "arguments": a} for n, a in more]
    return Reply(content=kwargs.pop("content", None), tool_calls=calls, **kwargs)


def error(status: int, message: str = "", **kwargs: Any) -> Reply:
    """An HTTP error answer (``retry_after_ms=`` adds a ``retry-after-ms`` header)."""
    headers = dict(kwargs.pop("headers", {}))
    if "retry_after_ms" in kwargs:
        headers["retry-after-ms"] = str(kwargs.pop("retry_after_ms"))
    return Reply(status=status, error=message or f"injected HTTP {status}", headers=headers, **kwargs)


def words(value: Any) -> int:
    return len(str(value or "").split())


class LLMServer:
    """The server; see the module docstring. Thread-safe; start/stop or use ``with``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, model: str = DEFAULT_MODEL):
        self.host = host
        self.model = model
        self.requests: list[dict] = []
        self._queue: list[Reply] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer((host, port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None
        self._ids = 0

    # -- control -------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """The base URL clients use (ends in ``/v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> LLMServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="llm-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> LLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def queue(self, *replies: Reply | str) -> None:
        """Script the next answers, in order (a plain string is a text answer)."""
        with self._lock:
            self._queue.extend(text(r) if isinstance(r, str) else r for r in replies)

    def pending(self) -> int:
        """Scripted answers not used yet."""
        with self._lock:
            return len(self._queue)

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self.requests.clear()

    def settings(self, **overrides: Any) -> dict:
        """An ``llm`` settings dict pointing at this server (retries without waiting)."""
        conf = {
            "base_url": self.url,
            "api_key": API_KEY,
            "model": self.model,
            "timeout_seconds": 10,
            "max_retries": 2,
            "retry_backoff_seconds": 0,
            "retry_max_backoff_seconds": 0,
        }
        conf.update(overrides)
        return conf

    def chat_requests(self) -> list[dict]:
        """The bodies of the chat completion requests received, in order."""
        with self._lock:
            return [r["body"] for r in self.requests if r["path"].endswith("/chat/completions")]

    # -- answering -----------------------------------------------------------------
    def _next_reply(self, body: dict) -> Reply:
        with self._lock:
            if self._queue:
                return self._queue.pop(0)
        return default_reply(body)

    def _record(self, path: str, headers: dict, body: Any) -> None:
        with self._lock:
            self.requests.append({"path": path, "headers": headers, "body": body})

    def _new_id(self) -> str:
        with self._lock:
            self._ids += 1
            return f"chatcmpl-{self._ids}"

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)


def default_reply(body: dict) -> Reply:
    """The answer when nothing is scripted (see the module docstring)."""
    messages = body.get("messages") or []
    last_user = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema") or {}
        return text(json.dumps(example_of(schema, "value")))
    system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
    category = pick_category(system, str(last_user))
    if category is not None:
        return text(category)
    search = next(
        (
            (t.get("function") or {}).get("name")
            for t in body.get("tools") or []
            if re.search(r"retrieval|search", str((t.get("function") or {}).get("name")), re.I)
        ),
        None,
    )
    if search and not any(m.get("role") == "tool" for m in messages):
        return tool_call(search, {"query": str(last_user)})
    cited = cite_knowledge(messages, str(last_user))
    if cited is not None:
        return text(cited)
    return text(f"echo: {last_user}")


_BLOCK_HEAD = re.compile(r"(?m)^ID: (\d+)$")
_CONTENT = "└── Content:\n"


def _blocks_in(text: str) -> list[tuple[str, str]]:
    """``(number, content)`` of each knowledge block in ``text`` (no backtracking regex:
    blocks may be long)."""
    heads = list(_BLOCK_HEAD.finditer(text))
    out = []
    for i, head in enumerate(heads):
        body = text[head.end() : heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        at = body.find(_CONTENT)
        if at >= 0:
            out.append((head.group(1), body[at + len(_CONTENT) :].strip()))
    return out


def cite_knowledge(messages: list[dict], question: str) -> str | None:
    """For a prompt with knowledge blocks, the best block's best sentence and its ``[ID:n]``."""
    blocks = []
    for m in messages:
        blocks += _blocks_in(str(m.get("content") or ""))
    if not blocks:
        return None
    asked = set(re.findall(r"\w+", question.lower()))

    def overlap(text: str) -> int:
        return len(asked & set(re.findall(r"\w+", text.lower())))

    number, content = max(blocks, key=lambda b: overlap(b[1]))
    sentences = [s.strip() for s in re.split(r"(?<=[.!?。])\s+|\n+", content) if s.strip()]
    sentence = max(sentences, key=overlap) if sentences else content.strip()
    return f"{sentence} [ID:{number}]"


def embedding_of(text: str) -> list[float]:
    """The test server's vector for ``text`` (see the module docstring)."""
    vector = [0.0] * EMBEDDING_DIMENSIONS
    for word in re.findall(r"\w+", str(text).lower()):
        digest = hashlib.sha256(word.encode()).digest()
        vector[digest[0] % EMBEDDING_DIMENSIONS] += 1.0 if digest[1] % 2 else -1.0
    norm = sum(v * v for v in vector) ** 0.5 or 1.0
    return [v / norm for v in vector]


def example_of(schema: dict, name: str) -> Any:
    """A small value that fits a JSON schema."""
    if "enum" in schema and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object":
        return {k: example_of(v, k) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [example_of(schema.get("items") or {}, name)]
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    return f"example {name}"


_CATEGORY_LINE = re.compile(r"^- (.+?):", re.M)


def pick_category(system: str, query: str) -> str | None:
    """For a classification prompt, the category sharing most words with the query."""
    if "Categories:" not in system:
        return None
    part = system.split("Categories:", 1)[1]
    names = _CATEGORY_LINE.findall(part.split("\n\n", 1)[0])
    if not names:
        return None
    asked = set(re.findall(r"\w+", query.lower()))
    best, best_score = names[-1], 0
    for name in names:
        examples = re.findall(rf"^Example \({re.escape(name)}\): (.*)$", system, re.M)
        vocabulary = set(re.findall(r"\w+", " ".join([name, *examples]).lower()))
        score = len(asked & vocabulary)
        if score > best_score:
            best, best_score = name, score
    return best


def _handler(server: LLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            pass

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            server._record(self.path, {k.lower(): v for k, v in self.headers.items()}, None)
            if self.path.rstrip("/").endswith("/models"):
                data = [
                    {"id": server.model, "object": "model", "created": 0, "owned_by": "agentcanvas-tests"}
                ]
                self._json(200, {"object": "list", "data": data})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._json(
                    400, {"error": {"message": "the body is not JSON", "type": "invalid_request_error"}}
                )
                return
            server._record(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            if self.path.rstrip("/").endswith("/embeddings"):
                self._embeddings(body)
                return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            if not isinstance(body.get("messages"), list) or not body.get("model"):
                self._json(
                    400, {"error": {"message": "'model' and 'messages' are required", "type": "invalid"}}
                )
                return
            reply = server._next_reply(body)
            server._sleep(reply.delay)
            try:
                if reply.status != 200:
                    err = {"message": reply.error, "type": "injected", "code": reply.status}
                    self._json(reply.status, {"error": err}, reply.headers)
                elif body.get("stream"):
                    self._stream(body, reply)
                else:
                    self._json(200, self._completion(body, reply), reply.headers)
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (e.g. its timeout): nothing to answer

        def _embeddings(self, body: dict) -> None:
            texts = body.get("input")
            if isinstance(texts, str):
                texts = [texts]
            if not body.get("model") or not isinstance(texts, list) or not texts:
                self._json(400, {"error": {"message": "'model' and 'input' are required", "type": "invalid"}})
                return
            reply = server._next_reply(body) if server.pending() else Reply()
            server._sleep(reply.delay)
            if reply.status != 200:
                err = {"message": reply.error, "type": "injected", "code": reply.status}
                self._json(reply.status, {"error": err}, reply.headers)
                return
            data = [
                {"object": "embedding", "index": i, "embedding": embedding_of(t)} for i, t in enumerate(texts)
            ]
            tokens = sum(words(t) for t in texts)
            self._json(
                200,
                {
                    "object": "list",
                    "data": data,
                    "model": body["model"],
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                },
            )

        # -- shapes ---------------------------------------------------------------
        def _usage(self, body: dict, reply: Reply) -> dict:
            if reply.usage is not None:
                return reply.usage
            prompt = sum(words(m.get("content")) for m in body["messages"])
            completion = words(reply.content) + sum(words(json.dumps(c)) for c in reply.tool_calls)
            return {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }

        def _calls(self, reply: Reply) -> list[dict]:
            out = []
            for i, call in enumerate(reply.tool_calls):
                args = call.get("arguments")
                args = args if isinstance(args, str) else json.dumps(args or {})
                out.append(
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": call["name"], "arguments": args},
                    }
                )
            return out

        def _completion(self, body: dict, reply: Reply) -> dict:
            message: dict[str, Any] = {"role": "assistant", "content": reply.content}
            if reply.tool_calls:
                message["tool_calls"] = self._calls(reply)
            return {
                "id": server._new_id(),
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                    }
                ],
                **({} if reply.no_usage else {"usage": self._usage(body, reply)}),
            }

        def _stream(self, body: dict, reply: Reply) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.end_headers()
            cid, created = server._new_id(), int(time.time())

            def chunk(delta: dict, finish: str | None = None, **extra: Any) -> dict:
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                return {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": body["model"],
                    "choices": [choice],
                    **extra,
                }

            events = [chunk({"role": "assistant", "content": ""})]
            pieces = (
                reply.chunks if reply.chunks is not None else re.findall(r"\S+\s*|\s+", reply.content or "")
            )
            events += [chunk({"content": p}) for p in pieces]
            for i, call in enumerate(self._calls(reply)):
                args = call["function"]["arguments"]
                half = len(args) // 2
                head = {"index": i, "id": call["id"], "type": "function"}
                events.append(
                    chunk({"tool_calls": [{**head, "function": {"name": call["function"]["name"]}}]})
                )
                for part in (args[:half], args[half:]):
                    events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]}))
            events.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
            if (body.get("stream_options") or {}).get("include_usage") and not reply.no_usage:
                last = chunk({})
                last["choices"], last["usage"] = [], self._usage(body, reply)
                events.append(last)
            for n, event in enumerate(events):
                if reply.drop_after is not None and n == reply.drop_after + 1:
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if reply.stall_after is not None and n == reply.stall_after + 1:
                    server._sleep(reply.stall)
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _json(self, status: int, payload: dict, headers: dict | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="An OpenAI-compatible test LLM server (scripted/echo replies)."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args(argv)
    server = LLMServer(args.host, args.port, args.model)
    print(
        f"test LLM server on {server.url} (model {args.model!r}); it echoes, classifies and fills JSON schemas"
    )
    print("point agentcanvas at it (no real API key needed):")
    print(f"  export AGENTCANVAS_LLM_BASE_URL={server.url}")
    print(f"  export AGENTCANVAS_LLM_MODEL={args.model}")
    print("  export AGENTCANVAS_LLM_API_KEY=test")
    print("Ctrl-C stops it.", flush=True)
    try:
        server._httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server._httpd.server_close()


if __name__ == "__main__":
    main()
