"""Configuration: conf/service_conf.yaml overridden by AGENTCANVAS_* variables."""

from __future__ import annotations

from agent.settings import load_settings


def test_environment_overrides_keep_types_and_text():
    settings = load_settings(
        {
            "AGENTCANVAS_LLM_API_KEY": "0123",
            "AGENTCANVAS_LLM_MODEL": "1.5",
            "AGENTCANVAS_LLM_CONTEXT_SIZE": "8000",
            "AGENTCANVAS_INVOKE_ALLOW_HOSTS": '["127.0.0.1", "10.0.0.0/8"]',
            "AGENTCANVAS_SERVER_LEASE_SECONDS": "2",
            "AGENTCANVAS_LIMITS_MAX_STEPS": "5",
            "AGENTCANVAS_DATABASE_URL": "mysql://root@127.0.0.1:3306/x",
            "OTHER_VARIABLE": "ignored",
        }
    )
    assert settings["llm"]["api_key"] == "0123" and settings["llm"]["model"] == "1.5"
    assert settings["llm"]["context_size"] == 8000
    assert settings["invoke"]["allow_hosts"] == ["127.0.0.1", "10.0.0.0/8"]
    assert settings["server"]["lease_seconds"] == 2 and settings["limits"]["max_steps"] == 5
    assert settings["database"]["url"] == "mysql://root@127.0.0.1:3306/x"


def test_the_file_is_found_from_the_package_not_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_settings({})["limits"]["max_steps"] == 1000
    conf = tmp_path / "mine.yaml"
    conf.write_text("limits:\n  max_steps: 7\n")
    assert load_settings({"AGENTCANVAS_CONF": str(conf)})["limits"]["max_steps"] == 7
