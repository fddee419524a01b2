"""LLM: one chat completion with the node's memory; the base of Agent and Categorize.

Params (RAGFlow's): ``llm_id`` (``model@provider``; empty: the default provider),
``sys_prompt``, ``prompts`` (``[{role, content}]``, default one user message
``{sys.query}``; a plain string is one user message), ``temperature``, ``top_p``,
``max_tokens``, ``presence_penalty``, ``frequency_penalty`` — each sent when its
``*Enabled`` flag (``temperatureEnabled``, ``topPEnabled``, ``maxTokensEnabled``,
``presencePenaltyEnabled``, ``frequencyPenaltyEnabled``) is true, or, with no flag,
when the value is not 0 — ``message_history_window_size`` (1–100, 20 when absent,
0: no history), ``output_structure`` (a JSON schema; also read from RAGFlow's
``outputs.structured``), ``cite`` (true by default: when chunks were found in this
turn — by a Retrieval component or tool — the system prompt asks the model to cite
them as ``[ID:n]``, and ``message_end`` carries the cited chunks as ``reference``). Ours: ``history_source`` (``"node"``: the node's own
exchanges, the default; ``"conversation"``: the session's queries and final
answers) and ``memory_key`` (a template such as ``"{sys.user_id}"``: keep the node's
memory under that key beyond the session, see :mod:`agent.memory`) and ``compaction``
(``true`` or ``{"max_summary_tokens": N}``: what the window drops is summarised, see
:mod:`agent.compaction`).

Outputs: ``content`` (the answer) and, with a schema, ``structured`` (the parsed JSON).

When a Message component that this node can reach (without passing a form)
references ``{this@content}`` and no ``exception_method`` is set, ``content`` is an
:class:`~agent.stream.LazyText`: the Message streams the answer as it arrives, and
usage and memory are recorded when the stream ends (so ``node_finished`` of a
streamed node carries no usage; the turn's usage does). Otherwise the answer is read
whole inside the node.

Memory: only a successful exchange is remembered (the rendered user prompt and the
answer); see :mod:`agent.memory` for the window and the token budget.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from agent import compaction
from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.errors import ComponentError, LLMError
from agent.files import MARKER_RE, document_blocks, image_parts
from agent.llm.client import ChatClient, ChatResult, ChatStream, ToolCall
from agent.llm.config import ModelConfig, resolve_model
from agent.llm.tokens import IMAGE_TOKENS, count_tokens, messages_tokens
from agent.memory import DEFAULT_WINDOW, MAX_WINDOW, NodeMemory, history_budget, select_history
from agent.refs import to_text
from agent.settings import load_settings
from agent.stream import LazyText

# param name → (flag name, API name)
_GEN_PARAMS = {
    "temperature": ("temperatureEnabled", "temperature"),
    "top_p": ("topPEnabled", "top_p"),
    "max_tokens": ("maxTokensEnabled", "max_tokens"),
    "presence_penalty": ("presencePenaltyEnabled", "presence_penalty"),
    "frequency_penalty": ("frequencyPenaltyEnabled", "frequency_penalty"),
}
_RANGES = {"temperature": (0, 2), "top_p": (0, 1), "presence_penalty": (-2, 2), "frequency_penalty": (-2, 2)}
_ROLES = ("user", "assistant", "system")
CITATION_GUIDE = (
    "Citations: the knowledge you are given comes in blocks that start with 'ID: n'. "
    "When a sentence of your answer uses a block, end that sentence with its marker, "
    "written exactly as [ID:n] (for example [ID:0]); several blocks give several markers. "
    "Cite only IDs that appear in the blocks, never make one up, and do not cite "
    "what the blocks do not say."
)
#: Tokens the turn's documents may take when the model's context size is unknown.
FILES_BUDGET_UNKNOWN = 8000


class LLMParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.llm_id = ""
        self.sys_prompt = ""
        self.prompts: Any = [{"role": "user", "content": "{sys.query}"}]
        self.temperature: Any = 0
        self.top_p: Any = 0
        self.max_tokens: Any = 0
        self.presence_penalty: Any = 0
        self.frequency_penalty: Any = 0
        self.message_history_window_size: Any = DEFAULT_WINDOW
        self.history_source = "node"
        self.memory_key = ""
        self.output_structure: Any = None
        self.cite = True
        self.compaction: Any = False

    def check(self) -> None:
        if self.llm_id is None:
            self.llm_id = ""
        if not isinstance(self.llm_id, str):
            raise ValueError(f"llm_id must be text like 'model@provider' (or empty), got {self.llm_id!r}")
        if self.sys_prompt is None:
            self.sys_prompt = ""
        if not isinstance(self.sys_prompt, str):
            raise ValueError(f"sys_prompt must be text, got {self.sys_prompt!r}")
        self.prompts = normalize_prompts(self.prompts)
        self._numbers_from_text()
        for name, (low, high) in _RANGES.items():
            self.check_number(name, minimum=low, maximum=high)
        self.check_nonnegative_int("max_tokens")
        if self.message_history_window_size is None:
            self.message_history_window_size = DEFAULT_WINDOW
        self.check_nonnegative_int("message_history_window_size", maximum=MAX_WINDOW)
        self.check_choice("history_source", ("node", "conversation"))
        if not isinstance(self.memory_key, str):
            raise ValueError(
                f"memory_key must be a text template such as '{{sys.user_id}}', got {self.memory_key!r}"
            )
        if self.memory_key and self.history_source == "conversation":
            raise ValueError(
                "memory_key keeps the node's own memory; it cannot be used with history_source 'conversation'"
            )
        if compaction.parse_setting(self.compaction) is not None and (
            self.memory_key or self.history_source == "conversation"
        ):
            raise ValueError(
                "compaction summarises the node's own session memory; it cannot be used with memory_key or "
                "history_source 'conversation'"
            )
        if isinstance(self.output_structure, str) and self.output_structure.strip():
            try:
                self.output_structure = json.loads(self.output_structure)
            except ValueError:
                pass
        if self.output_structure not in (None, "", {}) and not isinstance(self.output_structure, dict):
            # RAGFlow loads such a node and ignores the value: so do we, and say so.
            self.warn(
                f"output_structure is not a JSON schema object ({type(self.output_structure).__name__}); "
                f"it is ignored and the node answers in plain text"
            )
            self.output_structure = None

    def _numbers_from_text(self) -> None:
        """Sampling params written as text (``"0.1"``) become numbers, as RAGFlow's
        ``float()``/``int()`` make them; text that is no number stays an error."""
        for name in _GEN_PARAMS:
            value = getattr(self, name)
            if not isinstance(value, str):
                continue
            text = value.strip()
            try:
                setattr(self, name, int(text) if name == "max_tokens" else float(text) if text else 0)
            except ValueError:
                kind = "a whole number" if name == "max_tokens" else "a number"
                raise ValueError(f"{name} must be {kind}, got {value!r}") from None

    def schema(self) -> dict | None:
        """The structured-output JSON schema, from ``output_structure`` or RAGFlow's ``outputs.structured``."""
        if self.output_structure not in (None, "", {}):
            return self.output_structure
        cand = self.outputs.get("structured") if isinstance(self.outputs, dict) else None
        if isinstance(cand, dict):
            for schema in (cand, cand.get("schema"), cand.get("structured")):
                if (
                    isinstance(schema, dict)
                    and isinstance(schema.get("properties"), dict)
                    and schema["properties"]
                ):
                    return schema
        return None

    def gen_options(self) -> dict:
        """The sampling options to send (see the module docstring for the flags)."""
        out = {}
        for name, (flag, api_name) in _GEN_PARAMS.items():
            value = getattr(self, name)
            enabled = getattr(self, flag, None)
            if enabled is None:
                enabled = value not in (0, None)
            if not enabled or (name == "max_tokens" and not value):
                continue
            out[api_name] = int(value) if name == "max_tokens" else float(value)
        return out


def normalize_prompts(prompts: Any) -> list[dict]:
    """``prompts`` as ``[{role, content}]``; raises ``ValueError`` naming the bad entry."""
    if isinstance(prompts, str):
        prompts = [{"role": "user", "content": prompts}]
    if not isinstance(prompts, list) or not prompts:
        raise ValueError(
            "prompts must be a non-empty list of {role, content}, e.g. [{role: user, content: '{sys.query}'}]"
        )
    for i, p in enumerate(prompts):
        if not isinstance(p, dict) or not isinstance(p.get("content"), str):
            raise ValueError(f"prompts[{i}] must be {{role, content}} with text content, got {p!r}")
        role = p.get("role") or "user"
        if role not in _ROLES:
            raise ValueError(f"prompts[{i}] has role {role!r}; use one of {', '.join(_ROLES)}")
        p["role"] = role
    return prompts


@register
class LLM(ComponentBase):
    component_name = "LLM"
    param_class = LLMParam
    #: Whether the turn's files go to the model (not for Categorize, which classifies text).
    takes_files = True

    # -- what subclasses change ---------------------------------------------------------
    def system_prompt(self) -> str:
        text = self.render(self._param.sys_prompt) if self._param.sys_prompt else ""
        if self._param.cite and self.cites_knowledge():
            text = f"{text}\n\n{CITATION_GUIDE}" if text else CITATION_GUIDE
        return text

    def cites_knowledge(self) -> bool:
        """Whether the answer may draw on knowledge blocks (chunks found this turn)."""
        return bool(self._canvas.turn_references())

    def prompt_messages(self, kwargs: dict) -> list[dict]:
        """The rendered ``prompts`` (the messages after the history)."""
        return [{"role": p["role"], "content": self.render(p["content"])} for p in self._param.prompts]

    def tool_specs(self) -> list[dict]:
        """OpenAI ``tools`` to offer (none here; Agent offers its tools)."""
        return []

    def call_tool(self, call: ToolCall) -> str:
        raise LLMError(f"{self.id}: the model asked for tool {call.name!r} but this node offers no tools")

    def max_rounds(self) -> int:
        return 0

    def accept_answer(self, answer: str) -> str:
        """Set the outputs from the final answer; returns what memory stores as the answer."""
        schema = self._param.schema()
        if schema is not None:
            self.set_output("structured", parse_json_answer(answer, self.id))
        self.set_output("content", answer)
        return answer

    # -- running ---------------------------------------------------------------------
    def _invoke(self, **kwargs: Any) -> Iterator[str] | None:
        model = self.model()
        memory = self.node_memory()
        with self._canvas.files_as_markers() as marked:
            system = self.system_prompt()
            prompts = self.prompt_messages(kwargs)
        tools = self.tool_specs()
        head = [{"role": "system", "content": system}] if system else []
        options = self._param.gen_options()
        schema = self._param.schema()
        if schema is not None:
            options["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "structured", "schema": schema},
            }
        if tools:
            options["tools"] = tools
        prompt_tokens = messages_tokens(head + prompts) + (count_tokens(json.dumps(tools)) if tools else 0)
        turn_files = self._canvas.turn_files() if self.takes_files and not kwargs.get("user_prompt") else []
        head, prompts, remembered, attached, cut, file_tokens = self.put_files(
            head, prompts, marked, turn_files, model, options.get("max_tokens", 0), prompt_tokens
        )
        prompt_tokens += file_tokens
        window = int(self._param.message_history_window_size)
        budget = history_budget(model.context_size, options.get("max_tokens", 0), prompt_tokens)
        client = ChatClient(model, who=self.id, sleep=self._canvas.sleep, deadline=self._canvas.deadline)
        usage: dict[str, int] = {}
        summary_limit = compaction.parse_setting(self._param.compaction)
        compacted = None
        if summary_limit is None:
            summary_head: list[dict] = []
            history = select_history(memory.entries(window), window, budget)
        else:
            history, summary_head, compacted = self._compact(
                client, memory, window, budget, summary_limit, usage
            )
            if model.context_size:
                self._tool_context = int(model.context_size) - max(0, int(options.get("max_tokens", 0) or 0))
        messages = head + summary_head + history + prompts
        # Memory keeps the files' names, never their content (attach again to resend).
        user_prompt = "\n\n".join(p["content"] for p in remembered if p["role"] == "user")
        self.inputs_seen = {"llm_id": model.llm_id, "prompt": user_prompt, "history_messages": len(history)}
        if summary_head:
            self.inputs_seen["summary"] = True
        if attached:
            user_prompt = f"{user_prompt}\n\n[attached: {', '.join(attached)}]"
            self.inputs_seen["files"] = attached
        if cut:
            self.inputs_seen["files_cut"] = cut
        streamed = schema is None and self._streams_to_message()
        rounds = self._rounds(client, messages, options, usage, streamed=streamed)

        def done(answer: str) -> None:
            stored = self.accept_answer(answer)
            self._record_usage(usage)
            if compacted is not None:
                compaction.apply(self._canvas.memory, self.id, *compacted)
            memory.append(user_prompt, stored)

        if streamed:
            # Connect now so that an HTTP error is this node's; stream the rest lazily.
            first = next(rounds, None)
            self.set_output("content", LazyText(_prepend(first, rounds), on_done=done))
            return None
        done("".join(rounds))
        return None

    def _compact(
        self, client: ChatClient, memory: NodeMemory, window: int, budget: int, limit: int, usage: dict
    ) -> tuple[list[dict], list[dict], tuple[int, str] | None]:
        """The history and summary to send, and what to commit if the exchange succeeds.

        Returns ``(history, summary messages, (entries summarised, new summary) or None)``.
        """
        entries = memory.entries(MAX_WINDOW)
        summary = compaction.stored_summary(self._canvas.memory, self.id)
        head = compaction.summary_messages(summary)
        history = select_history(entries, window, budget - messages_tokens(head))
        if len(history) == len(entries):
            return history, head, None
        cut = compaction.split_for_summary(entries, len(history))
        request = compaction.summary_request(summary, entries[:cut], limit)
        try:
            result = client.complete(request, max_tokens=limit)
        except LLMError:
            # No summary from a failed call: this answer goes with the plain window.
            return history, head, None
        _add_usage(usage, result.usage, request, result)
        new = compaction.bounded(result.content or "", limit)
        if not new:
            return history, head, None
        head = compaction.summary_messages(new)
        history = select_history(entries[cut:], window, budget - messages_tokens(head))
        return history, head, (cut, new)

    def put_files(
        self,
        head: list[dict],
        prompts: list[dict],
        marked: dict[str, dict],
        turn_files: list[dict],
        model: ModelConfig,
        max_tokens: int,
        prompt_tokens: int,
    ) -> tuple[list[dict], list[dict], list[dict], list[str], list[str], int]:
        """Files into the messages (docs/design.md §13).

        Documents the prompts reference (``marked``) take their text where they are
        referenced; the turn's other documents are added to the last user message;
        together they take at most what the context leaves (``FILES_BUDGET_UNKNOWN``
        tokens when the model's context size is unknown), with a note of what was cut.
        The turn's images go to the last user message as image parts when the model
        takes them; otherwise the node fails saying so.

        Returns:
            ``(head, prompts, prompts as memory keeps them (file names only), the turn's
            file names, notes of what was cut, tokens added)``.
        """
        service = self._canvas.services.get("files")
        if service is None or not (marked or turn_files):
            return head, prompts, prompts, [], [], 0
        images = image_parts(turn_files, service, model.vision, self.id)
        if model.context_size:
            budget = int(model.context_size) - max(0, int(max_tokens or 0)) - prompt_tokens
        else:
            budget = FILES_BUDGET_UNKNOWN
        documents = list(marked.values()) + [f for f in turn_files if str(f.get("id")) not in marked]
        blocks, cut, used = document_blocks(documents, service, budget)
        extra = "\n\n".join(blocks[i] for i in blocks if i not in marked)

        def filled(messages: list[dict], names_only: bool) -> list[dict]:
            def block(m: re.Match) -> str:
                found = marked.get(m.group(1), {})
                return f"[file: {found.get('name')}]" if names_only else blocks.get(m.group(1), "")

            return [{**p, "content": MARKER_RE.sub(block, p["content"])} for p in messages]

        head = filled(head, names_only=False)
        remembered = filled(prompts, names_only=True)
        prompts = filled(prompts, names_only=False)
        if extra or images:
            last = next((i for i in range(len(prompts) - 1, -1, -1) if prompts[i]["role"] == "user"), None)
            if last is None:
                prompts.append({"role": "user", "content": ""})
                last = len(prompts) - 1
            content = "\n\n".join(t for t in (prompts[last]["content"], extra) if t)
            prompts[last]["content"] = [{"type": "text", "text": content}, *images] if images else content
        names = [str(f.get("name")) for f in turn_files]
        return head, prompts, remembered, names, cut, used + len(images) * IMAGE_TOKENS

    def _rounds(
        self, client: ChatClient, messages: list[dict], options: dict, usage: dict, streamed: bool
    ) -> Iterator[str]:
        """The answer's text, round after round of tool calls (at most ``max_rounds``).

        Yields the text as it arrives (streamed) or each round's text whole. After
        ``max_rounds`` rounds with tool calls the model is asked once more with
        ``tool_choice: none`` for the final answer. Rounds' texts are separated by a
        blank line. ``usage`` is summed in place.
        """
        messages = list(messages)
        wrote = False
        limit = self.max_rounds() if options.get("tools") else 0
        for n in range(limit + 1):
            last = n == limit
            call_options = dict(options)
            if last and options.get("tools"):
                call_options["tool_choice"] = "none"
            if streamed:
                stream: ChatStream = client.stream(messages, **call_options)
                first = True
                for delta in stream:
                    if first and wrote:
                        yield "\n\n"
                    first, wrote = False, True
                    yield delta
                result: ChatResult = stream.result
            else:
                result = client.complete(messages, **call_options)
                if result.content:
                    if wrote:
                        yield "\n\n"
                    wrote = True
                    yield result.content
            _add_usage(usage, result.usage, messages, result)
            if not result.tool_calls:
                return
            if last:
                if not wrote:
                    raise LLMError(
                        f"{self.id}: the model still asked for tools after max_rounds={limit} rounds and gave "
                        f"no answer; raise max_rounds or tell it in sys_prompt when to stop"
                    )
                return
            self._check_cancel()
            messages.append(
                {
                    "role": "assistant",
                    "content": result.content or None,
                    "tool_calls": [c.as_message() for c in result.tool_calls],
                }
            )
            for call in result.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": self.call_tool(call)})
            context = getattr(self, "_tool_context", None)
            if context:
                # Compaction: old tool results go first when the rounds fill the context.
                compaction.clear_old_tool_results(messages, context)

    def _check_cancel(self) -> None:
        self._canvas.deadline.check()

    def _record_usage(self, usage: dict) -> None:
        self.usage = dict(usage)
        self._canvas.add_usage(usage)

    # -- settings, memory, streaming decision --------------------------------------------
    def model(self) -> ModelConfig:
        """The model this node uses; settings from ``canvas.services["llm_settings"]``
        (the host's) or else ``load_settings()["llm"]``."""
        services = self._canvas.services
        settings = services.get("llm_settings")
        if settings is None:
            settings = services["llm_settings"] = load_settings().get("llm") or {}
        try:
            return resolve_model(self._param.llm_id, settings)
        except ComponentError as e:
            raise type(e)(f"{self.id}: {e}") from None

    def node_memory(self) -> NodeMemory:
        key = None
        if self._param.memory_key:
            key = self.render(self._param.memory_key).strip()
            if not key:
                raise self.fail(
                    f"memory_key {self._param.memory_key!r} rendered empty; pass what it names (e.g. a user_id "
                    f"for '{{sys.user_id}}') or remove memory_key"
                )
        return NodeMemory(self._canvas, self.id, key, self._param.history_source)

    def _streams_to_message(self) -> bool:
        cached = getattr(self, "_streamed", None)
        if cached is None:
            cached = self._streamed = self._find_streaming_message()
        return cached

    def _find_streaming_message(self) -> bool:
        components = self._canvas.components
        if self._param.exception_method or components.get(self.id) is not self:
            return False
        seen, todo = set(), list(self.possible_next())
        while todo:
            cid = todo.pop()
            if cid in seen or cid not in components:
                continue
            seen.add(cid)
            cpn = components[cid]
            if cpn.component_name == "Message" and any(
                r.scope == "cpn" and r.name == self.id and r.var == "content" and not r.path
                for r in cpn.references()
            ):
                return True
            if not cpn.is_form:  # a pause in between: the answer is read whole before it
                todo.extend(cpn.possible_next())
        return False


def _prepend(first: str | None, rest: Iterator[str]) -> Iterator[str]:
    if first is not None:
        yield first
        yield from rest


def _add_usage(total: dict, usage: dict | None, messages: list[dict], result: ChatResult) -> None:
    if usage is None:
        # The provider reported none: estimate with our own counts.
        prompt = messages_tokens(messages)
        completion = count_tokens(result.content) + sum(
            count_tokens(c.name) + count_tokens(c.arguments) for c in result.tool_calls
        )
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        total[key] = total.get(key, 0) + int(usage.get(key, 0) or 0)


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.S)


def parse_json_answer(answer: str, who: str) -> Any:
    """The JSON in a structured answer (a ```json fence and a leading <think> block allowed)."""
    text = re.sub(r"^.*?</think>", "", answer, flags=re.S) if "</think>" in answer else answer
    m = _FENCE.match(text)
    if m:
        text = m.group(1)
    try:
        return json.loads(text)
    except ValueError as e:
        raise LLMError(
            f"{who}: the model's answer is not the JSON that output_structure asks for ({e}); it began "
            f"{to_text(answer)[:120]!r}. Use a model that supports JSON-schema output, or retry (max_retries)"
        ) from None
