"""RAGFlow's Memory through ragflow-sdk 0.27 (the only generation that has it), against a
real server: create_memory, list_memory, add_message, search_message,
get_recent_messages, a Memory's messages and config, delete_memory."""

from __future__ import annotations

from tests.e2e.conftest import ragflow_sdk


def test_memory_calls_of_ragflow_sdk_027(deployment):
    sdk = ragflow_sdk("0.27")
    server = deployment.server()
    rag = sdk.RAGFlow(api_key=deployment.token(), base_url=server.url)

    memory = rag.create_memory(name="profile", memory_type=["raw"], embd_id="", llm_id="")
    assert memory.id and memory.memory_type == ["raw"] and memory.forgetting_policy == "FIFO"
    listed = rag.list_memory()
    assert listed["total_count"] == 1 and listed["memory_list"][0].id == memory.id

    rag.add_message(
        [memory.id], "agent-1", "session-1", "My cat is called Pixel", "What a name!", user_id="u1"
    )
    rag.add_message([memory.id], "agent-1", "session-2", "I drink green tea", "Noted.", user_id="u1")

    found = rag.search_message("what is my cat called", [memory.id])
    assert "My cat is called Pixel" in found[0]["content"] and found[0]["message_type"] == "raw"
    recent = rag.get_recent_messages([memory.id], session_id="session-2")
    assert [m["content"] for m in recent] == ["User Input: I drink green tea\nAgent Response: Noted."]
    assert memory.get_config().name == "profile"
    page = memory.list_memory_messages()
    assert page["messages"]["total_count"] == 2
    message_id = page["messages"]["message_list"][0]["message_id"]
    assert memory.get_message_content(message_id)["message_id"] == message_id
    assert memory.forget_message(message_id) is True

    other = sdk.RAGFlow(api_key=deployment.token("other"), base_url=server.url)
    assert other.list_memory()["total_count"] == 0
    try:
        other.search_message("cat", [memory.id])
        raise AssertionError("another tenant searched this tenant's memory")
    except Exception as exc:  # noqa: BLE001 - the SDK raises plain Exception with the message
        assert "not found" in str(exc)

    rag.delete_memory(memory.id)
    assert rag.list_memory()["total_count"] == 0
