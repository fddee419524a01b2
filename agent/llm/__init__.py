"""LLM access for the LLM-backed components: providers, a chat client, token counts.

* :mod:`agent.llm.config` — which model and provider an ``llm_id`` names
  (:func:`resolve_model`), from the ``llm`` settings;
* :mod:`agent.llm.client` — :class:`ChatClient` over the OpenAI Chat Completions
  protocol (streaming, tool calls, JSON-schema output), retries and clear errors;
* :mod:`agent.llm.tokens` — ``cl100k_base`` token counts, loaded offline.
"""

from __future__ import annotations

from agent.llm.client import ChatClient, ChatResult, ChatStream, ToolCall
from agent.llm.config import ModelConfig, resolve_model, split_llm_id
from agent.llm.tokens import count_tokens, message_tokens

__all__ = [
    "ChatClient",
    "ChatResult",
    "ChatStream",
    "ToolCall",
    "ModelConfig",
    "resolve_model",
    "split_llm_id",
    "count_tokens",
    "message_tokens",
]
