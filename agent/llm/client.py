"""A chat client over the OpenAI Chat Completions protocol (the ``openai`` package).

    client = ChatClient(resolve_model(llm_id, settings), who="LLM:Answer", sleep=canvas.sleep)
    result = client.complete(messages)                 # ChatResult(content, tool_calls, usage)
    stream = client.stream(messages)                   # connects now; errors raise here
    for delta in stream: ...                           # text as it arrives
    stream.result                                      # the ChatResult, once exhausted

Errors are :class:`~agent.errors.LLMError` (HTTP errors, unreachable server, bad
answer) or :class:`~agent.errors.LLMTimeout`, each naming the node, the provider and
what to check. The API key is never part of a message.

Retries: HTTP 429 and 5xx are retried ``max_retries`` times with exponential backoff
(``retry_backoff_seconds`` doubling up to ``retry_max_backoff_seconds``; a
``Retry-After``/``retry-after-ms`` header wins). The ``openai`` client's own retry
loop is switched off because its backoff is fixed (0.5 s to 8 s) and sleeps with
``time.sleep``: ours is configurable and sleeps through the injected ``sleep`` (the
canvas's), so tests need not wait. Timeouts are not retried: each retry would cost
the whole timeout again. A stream that fails after its first chunk is not retried
either: part of the answer has already been shown. This layer is separate from, and
below, a component's ``max_retries`` (:meth:`agent.component.base.ComponentBase.invoke`):
an LLM node with ``max_retries=2`` and ``llm.max_retries=1`` may send up to 3 × 2 requests.

Deadlines: every call obeys the ``deadline`` given (the turn's, see
:mod:`agent.deadline`). The request and its headers must come within
``timeout_seconds`` and a stream may pause at most that long between chunks; the
turn's ``max_seconds`` and a cancel stop it wherever it is, within a fraction of a
second. The ``openai`` client's blocking waits cannot be sliced, so they run in a
helper thread (:func:`agent.deadline.call`, :func:`agent.deadline.iterate`) that is
abandoned — its connection closed — when the turn's wait ends first.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent import deadline as deadlines
from agent import telemetry
from agent.deadline import Deadline
from agent.errors import Cancelled, ComponentTimeout, LimitError, LLMError, LLMTimeout
from agent.llm.config import ModelConfig

if TYPE_CHECKING:
    import openai

# Servers that want no key still get an Authorization header from the openai client.
NO_KEY = "no-key"


@dataclass
class ToolCall:
    """One function call the model asked for; ``arguments`` is JSON text as sent."""

    id: str
    name: str
    arguments: str = ""

    def as_message(self) -> dict:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class ChatResult:
    """A whole answer: text, requested tool calls, token usage (``None`` if not reported)."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: dict[str, int] | None = None
    finish_reason: str | None = None


def load_sdk():  # noqa: ANN201 - the openai module
    """The ``openai`` package, imported when it is first needed rather than with this module.

    It is the largest import of the app: importing ``api.cli`` took 1.8–2.7 s with it and
    1.0–1.3 s without (a slow machine), which every CLI command paid. ``create_app`` calls
    this, and ``agentcanvas serve`` before its workers fork: no turn waits for the import.
    """
    import openai

    return openai


_clients: dict[tuple, openai.OpenAI] = {}
_clients_lock = threading.Lock()


def _openai_client(config: ModelConfig) -> openai.OpenAI:
    """One ``openai.OpenAI`` per (URL, key, timeout), so connections are pooled across turns."""
    key = (config.base_url, config.api_key, config.timeout_seconds)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = load_sdk().OpenAI(
                base_url=config.base_url,
                api_key=config.api_key or NO_KEY,
                timeout=config.timeout_seconds or None,
                max_retries=0,
            )
            _clients[key] = client
        return client


class ChatClient:
    """Chat completions against one resolved model.

    Args:
        config: the model (from :func:`agent.llm.config.resolve_model`).
        who: the node id, put at the start of every error message.
        sleep: how to wait between retries (``canvas.sleep``, replaceable in tests).
        deadline: the turn's deadline and cancel (``canvas.deadline``); none by default.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        who: str = "",
        sleep: Callable[[float], None] = time.sleep,
        deadline: Deadline | None = None,
    ):
        self.config = config
        self.who = who
        self.sleep = sleep
        self.deadline = deadline or deadlines.unlimited()

    def _wait(self) -> Deadline:
        """The deadline of one wait: the turn's, narrowed to ``timeout_seconds``."""
        return self.deadline.within(self.config.timeout_seconds or None, "llm.timeout_seconds")

    # ------------------------------------------------------------------ calls
    def complete(self, messages: list[dict], **options: Any) -> ChatResult:
        """One whole answer. ``options``: ``tools``, ``tool_choice``, ``response_format``,
        ``temperature``, ``top_p``, ``max_tokens``, ``presence_penalty``, ``frequency_penalty``."""
        call = telemetry.llm_call(self.config.provider, self.config.model, streamed=False)
        try:
            result = self._complete(messages, **options)
        except BaseException as e:
            call.finish(error=e)
            raise
        call.finish(usage=result.usage)
        return result

    def _complete(self, messages: list[dict], **options: Any) -> ChatResult:
        response = self._create(messages, stream=False, **options)
        try:
            choice = response.choices[0]
        except (AttributeError, IndexError, TypeError):
            raise self._error(LLMError, "answered with no choices") from None
        message = choice.message
        calls = [
            ToolCall(id=c.id or f"call_{i}", name=c.function.name, arguments=c.function.arguments or "")
            for i, c in enumerate(message.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]
        return ChatResult(
            content=message.content or "",
            tool_calls=calls,
            usage=_usage(response.usage),
            finish_reason=choice.finish_reason,
        )

    def stream(self, messages: list[dict], **options: Any) -> ChatStream:
        """Start a streamed answer. Connecting (and its retries) happens here, so an HTTP
        error raises now; errors while reading raise from the iteration."""
        call = telemetry.llm_call(self.config.provider, self.config.model, streamed=True)
        try:
            raw = self._create(messages, stream=True, stream_options={"include_usage": True}, **options)
        except BaseException as e:
            call.finish(error=e)
            raise
        return ChatStream(raw, self, call)

    # ------------------------------------------------------------------ plumbing
    def embed(self, texts: list[str]) -> list[list[float]]:
        """One vector per text from the provider's embeddings endpoint (one request)."""
        if not texts:
            return []
        response = self._with_retries(
            lambda c, limits: c.embeddings.create(model=self.config.model, input=texts, **limits)
        )
        try:
            rows = sorted(response.data, key=lambda d: d.index)
            vectors = [list(map(float, d.embedding)) for d in rows]
        except (AttributeError, TypeError, ValueError):
            raise self._error(LLMError, "answered the embeddings request with no vectors") from None
        if len(vectors) != len(texts):
            raise self._error(LLMError, f"returned {len(vectors)} embeddings for {len(texts)} texts")
        return vectors

    def _create(self, messages: list[dict], **kwargs: Any) -> Any:
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return self._with_retries(
            lambda c, limits: c.chat.completions.create(
                model=self.config.model, messages=messages, **kwargs, **limits
            )
        )

    def _with_retries(self, call: Callable[[openai.OpenAI, dict], Any]) -> Any:
        """``call(client, limits)``, retried on HTTP 429 and 5xx; errors translated to ``LLMError``.

        ``limits`` holds the request's ``timeout``: the time left, so that the helper
        thread (see the module docstring) ends soon after an abandoned wait.
        """
        openai = load_sdk()
        client = _openai_client(self.config)
        attempt = 0
        while True:
            wait = self._wait()
            wait.check()
            left = min(self.config.timeout_seconds or math.inf, wait.remaining())
            limits = {} if left == math.inf else {"timeout": max(left, 0.001)}
            try:
                return deadlines.call(wait, lambda limits=limits: call(client, limits))
            except (Cancelled, LimitError):
                raise
            except ComponentTimeout as e:
                raise self.translate(e) from None
            except openai.APIStatusError as e:
                status = e.status_code
                if (status == 429 or status >= 500) and attempt < self.config.max_retries:
                    self.sleep(self._backoff(attempt, e.response.headers))
                    attempt += 1
                    continue
                raise self._status_error(e, attempt) from None
            except openai.OpenAIError as e:
                if isinstance(e, openai.APITimeoutError) or deadlines.is_timeout(e):
                    try:
                        deadlines.raise_if_spent(wait)
                    except ComponentTimeout as spent:
                        raise self.translate(spent) from None
                raise self.translate(e) from None

    def _backoff(self, attempt: int, headers: Any) -> float:
        cap = self.config.retry_max_backoff_seconds
        asked = _retry_after(headers)
        if asked is not None:
            return min(asked, max(cap, 0.0))
        return min(self.config.retry_backoff_seconds * (2**attempt), cap)

    def _where(self) -> str:
        c = self.config
        return f"LLM provider {c.provider!r} (model {c.model!r} at {c.base_url})"

    def _error(self, kind: type[LLMError], what: str) -> LLMError:
        prefix = f"{self.who}: " if self.who else ""
        return kind(self._scrub(f"{prefix}{self._where()} {what}"))

    def _scrub(self, text: str) -> str:
        key = self.config.api_key
        return text.replace(key, "***") if key and len(key) >= 4 else text

    def _status_error(self, e: openai.APIStatusError, retries: int) -> LLMError:
        detail = _error_detail(e)
        tried = f" after {retries + 1} attempts" if retries else ""
        hint = {
            401: "; check the API key in the provider's api_key_env variable (or AGENTCANVAS_LLM_API_KEY)",
            403: "; the API key may not have access to this model",
            404: "; check the model name and the base_url (it usually ends in /v1)",
            429: "; the provider is rate limiting: retry later or raise llm.max_retries",
        }.get(e.status_code, "")
        return self._error(LLMError, f"answered HTTP {e.status_code}{tried}: {detail}{hint}")

    def translate(self, e: BaseException) -> LLMError:
        """An ``openai`` (or transport) exception as an :class:`LLMError`/:class:`LLMTimeout`."""
        if isinstance(e, LLMError):
            return e
        openai = load_sdk()
        if isinstance(e, (openai.APITimeoutError, ComponentTimeout)) or deadlines.is_timeout(e):
            return self._error(
                LLMTimeout,
                f"did not answer within {self.config.timeout_seconds:g} s (llm.timeout_seconds)",
            )
        if isinstance(e, openai.APIStatusError):
            return self._status_error(e, 0)
        if isinstance(e, openai.APIConnectionError):
            cause = e.__cause__ or e.__context__
            reason = f": {cause}" if cause else ""
            return self._error(LLMError, f"could not be reached{reason}; is the server running at that URL?")
        if isinstance(e, openai.APIError):
            return self._error(LLMError, f"failed: {e.message}")
        return self._error(LLMError, f"failed: {type(e).__name__}: {e}")


class ChatStream:
    """A streamed answer: iterate for text deltas; :attr:`result` once exhausted.

    Tool-call deltas are assembled by index; usage comes from the final chunk
    (requested with ``stream_options.include_usage``).
    """

    def __init__(self, raw: Any, client: ChatClient, call: telemetry.LLMCall | None = None):
        self._raw = raw
        self._client = client
        self._call = call
        self._parts: list[str] = []
        self._calls: dict[int, ToolCall] = {}
        self._usage: dict[str, int] | None = None
        self._finish: str | None = None
        self.result: ChatResult | None = None

    def __iter__(self) -> Iterator[str]:
        try:
            yield from self._read()
        except GeneratorExit:  # the reader stopped early: not the provider's error
            if self._call is not None:
                self._call.finish(usage=self._usage)
            raise
        except BaseException as e:
            if self._call is not None:
                self._call.finish(usage=self._usage, error=e)
            raise
        if self._call is not None:
            self._call.finish(usage=self._usage)

    def _read(self) -> Iterator[str]:
        openai = load_sdk()
        try:
            client = self._client
            for chunk in deadlines.iterate(
                client.deadline,
                iter(self._raw),
                abandon=self.close,
                idle_seconds=client.config.timeout_seconds or None,
                idle_limit="llm.timeout_seconds",
            ):
                if getattr(chunk, "usage", None):
                    self._usage = _usage(chunk.usage)
                for choice in chunk.choices or ():
                    delta = choice.delta
                    if choice.finish_reason:
                        self._finish = choice.finish_reason
                    if delta is None:
                        continue
                    for tc in delta.tool_calls or ():
                        self._add_call_delta(tc)
                    if delta.content:
                        self._parts.append(delta.content)
                        yield delta.content
        except (Cancelled, LimitError):
            raise
        except (openai.OpenAIError, OSError, ComponentTimeout) as e:
            raise self._client.translate(e) from None
        except Exception as e:
            if deadlines.is_timeout(e) or type(e).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore"):
                raise self._client.translate(e) from None
            raise
        finally:
            self.close()
        if self._finish is None:
            # Every compatible server ends an answer with a finish_reason; without one
            # the connection was cut and the answer is incomplete.
            raise self._client._error(LLMError, "ended the stream before the answer was complete")
        self.result = ChatResult(
            content="".join(self._parts),
            tool_calls=[self._calls[i] for i in sorted(self._calls)],
            usage=self._usage,
            finish_reason=self._finish,
        )

    def _add_call_delta(self, tc: Any) -> None:
        index = tc.index if tc.index is not None else len(self._calls)
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = ToolCall(id=tc.id or f"call_{index}", name="")
        elif tc.id:
            call.id = tc.id
        fn = tc.function
        if fn is not None:
            if fn.name:
                call.name += fn.name
            if fn.arguments:
                call.arguments += fn.arguments

    def read(self) -> ChatResult:
        """Read the rest and return the whole result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def close(self) -> None:
        close = getattr(self._raw, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail too
                pass


def _usage(usage: Any) -> dict[str, int] | None:
    if usage is None:
        return None
    prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion = int(getattr(usage, "completion_tokens", 0) or 0)
    total = int(getattr(usage, "total_tokens", 0) or 0) or prompt + completion
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}


def _retry_after(headers: Any) -> float | None:
    if not headers:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw:
            try:
                value = float(raw) * scale
            except ValueError:
                continue
            if value >= 0:
                return value
    return None


def _error_detail(e: openai.APIStatusError) -> str:
    body = e.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    try:
        text = e.response.text
    except Exception:  # noqa: BLE001 - a streamed body may be unreadable
        text = ""
    return (text or e.message or "").strip()[:500]


def tool_arguments(call: ToolCall) -> dict:
    """A tool call's arguments as a dict; raises ``ValueError`` if they are not a JSON object."""
    text = call.arguments.strip() or "{}"
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"the arguments of tool call {call.name!r} are not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"the arguments of tool call {call.name!r} must be a JSON object, got {text[:80]!r}")
    return value
