"""CodeExec in the real bubblewrap sandbox: RAGFlow's inputs and outputs, Python and
JavaScript, and a suite of escape attempts that each end with a clear error while the
host stays healthy. Needs Debian's bubblewrap and nodejs (``make sandbox``)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from agent import sandbox
from agent.canvas import Canvas, Limits
from tests.agent.dsl_helpers import answer, final, make_dsl, node, outputs_of, run
from tests.llm_server import LLMServer, text, tool_call


@pytest.fixture(autouse=True, scope="module")
def _sandbox_installed():
    missing = sandbox.available()
    if missing:
        pytest.fail(f"CodeExec tests need the sandbox: {missing}")


PY_SUM = 'def main(a, b):\n    print("adding")\n    return {"sum": a + b, "who": "py"}\n'
JS_SUM = "async function main(args) {\n  console.log('adding');\n  return {sum: args.a + args.b, who: 'js'};\n}\nmodule.exports = { main };\n"
HEALTHY = 'def main():\n    return "still fine"\n'


def code_canvas(
    script: str, lang: str = "python", arguments=None, outputs=None, limits=None, **settings
) -> Canvas:
    params = {"lang": lang, "script": script, "arguments": arguments or {}}
    if outputs is not None:
        params["outputs"] = outputs
    dsl = make_dsl(
        node("CodeExec:Run", "CodeExec", params),
        node("Message:Out", "Message", {"content": ["{CodeExec:Run@content}"]}),
        begin={"inputs": {k: {"name": k, "type": "integer", "optional": True} for k in "ab"}},
    )
    tools = {"codeexec": {"timeout_seconds": 10, **settings}}
    return Canvas(dsl, services={"tools": tools}, limits=limits)


@pytest.mark.parametrize("lang, script", [("python", PY_SUM), ("javascript", JS_SUM), ("nodejs", JS_SUM)])
def test_main_gets_the_arguments_and_its_value_is_the_output(lang, script):
    canvas = code_canvas(script, lang, arguments={"a": "begin@a", "b": "begin@b"})
    events = run(canvas, "", inputs={"a": 2, "b": 40})
    assert final(events)["status"] == "succeeded", final(events)
    out = outputs_of(events, "CodeExec:Run")
    who = "py" if lang == "python" else "js"
    assert out["result"] == {"sum": 42, "who": who}
    assert out["actual_type"] == "Object"
    assert out["stdout"].strip() == "adding"
    assert answer(events) == f'{{\n  "sum": 42,\n  "who": "{who}"\n}}'


def test_a_declared_output_type_is_enforced():
    script = "def main(s):\n    return s.upper()\n"
    canvas = code_canvas(
        script, arguments={"s": "{sys.query} there"}, outputs={"loud": {"type": "String", "value": ""}}
    )
    events = run(canvas, "hi")
    assert outputs_of(events, "CodeExec:Run")["loud"] == "HI THERE" and answer(events) == "HI THERE"

    canvas = code_canvas("def main():\n    return [1, 2]\n", outputs={"n": {"type": "Number", "value": 0}})
    error = final(run(canvas, "x"))["error"]
    assert "main() returned Array<Number>, but output 'n' is declared Number" in error


@pytest.mark.parametrize(
    "lang, script, message",
    [
        ("python", "def main(:\n    pass\n", "SyntaxError: invalid syntax"),
        ("python", "x = 1\n", "the script defines no main() function"),
        ("python", "def main():\n    raise ValueError('nope')\n", "ValueError: nope"),
        ("python", "def main():\n    return object()\n", "main() returned a value that is not JSON data"),
        ("javascript", "module.exports = {};\n", "the script exports no main function"),
        (
            "javascript",
            "function main() { throw new TypeError('bad') }\nmodule.exports = { main };\n",
            "TypeError: bad",
        ),
    ],
)
def test_a_failing_program_fails_the_component_saying_why(lang, script, message):
    done = final(run(code_canvas(script, lang), "x"))
    assert done["status"] == "failed"
    assert "CodeExec:Run:" in done["error"] and message in done["error"], done["error"]


# ---------------------------------------------------------------- escape attempts
SECRET_FILE_TEXT = "the server's secret file"


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text(SECRET_FILE_TEXT)
    path.chmod(0o644)
    return path


@pytest.fixture
def listening_port():
    """A real server socket on the host's loopback: the sandbox must not reach it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    yield server.getsockname()[1]
    server.close()


def escape_attempts(secret_path: str, port: int) -> list[tuple[str, str, str, str]]:
    """(name, lang, script, what the error must say)."""
    return [
        (
            "read a server file",
            "python",
            f"def main():\n    return open({secret_path!r}).read()\n",
            "No such file or directory",
        ),
        (
            "read the project",
            "python",
            f"def main():\n    return open({__file__!r}).read()\n",
            "No such file or directory",
        ),
        (
            "read /etc/passwd",
            "javascript",
            "function main() { return require('fs').readFileSync('/etc/passwd', 'utf8') }\nmodule.exports = { main };\n",
            "ENOENT",
        ),
        (
            "write the file system",
            "python",
            "def main():\n    open('/usr/evil', 'w').write('x')\n",
            "Read-only file system",
        ),
        (
            "open a socket",
            "python",
            f"import socket\ndef main():\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    return 'connected'\n",
            "Connection refused",
        ),
        (
            "reach the internet",
            "python",
            "import socket\ndef main():\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n    return 'connected'\n",
            "Network is unreachable",
        ),
        (
            "open a socket from node",
            "javascript",
            f"const net = require('net');\nfunction main() {{ return new Promise((ok, fail) => {{ const s = net.connect({port}, '127.0.0.1'); s.on('connect', () => ok('connected')); s.on('error', fail); }}); }}\nmodule.exports = {{ main }};\n",
            "ECONNREFUSED",
        ),
        (
            "fork bomb",
            "python",
            "import os\ndef main():\n    while True:\n        os.fork()\n",
            "started more processes than allowed (32",
        ),
        (
            "allocate 10 GB",
            "python",
            "def main():\n    return len(bytearray(10 * 1024 ** 3))\n",
            "ran out of memory (limit 512 MB",
        ),
        (
            "allocate 10 GB in node",
            "javascript",
            "function main() { const a = []; for (let i = 0; i < 100; i++) a.push(Buffer.allocUnsafe(100 * 1024 * 1024)); return a.length }\nmodule.exports = { main };\n",
            "ran out of memory",
        ),
        (
            "print 1 GB",
            "python",
            "import sys\ndef main():\n    block = 'x' * (1 << 20)\n    for _ in range(1024):\n        sys.stdout.write(block)\n",
            "printed more than 1048576 bytes and was stopped",
        ),
        (
            "sleep past the deadline",
            "python",
            "import time\ndef main():\n    time.sleep(3600)\n",
            "ran longer than 4 s and was stopped",
        ),
        (
            "spin past the deadline",
            "javascript",
            "function main() { for (;;) {} }\nmodule.exports = { main };\n",
            "ran longer than 4 s",
        ),
    ]


@pytest.mark.parametrize("attempt", range(13), ids=[a[0] for a in escape_attempts("f", 1)])
def test_escape_attempts_end_with_a_clear_error_and_a_healthy_host(attempt, secret_file, listening_port):
    name, lang, script, message = escape_attempts(str(secret_file), listening_port)[attempt]
    started = time.monotonic()
    done = final(run(code_canvas(script, lang, timeout_seconds=4), "x"))
    assert done["status"] == "failed", f"{name}: {done}"
    assert message in done["error"], f"{name}: {done['error']}"
    assert SECRET_FILE_TEXT not in done["error"]
    assert time.monotonic() - started < 30
    # The host is fine: the file is intact and the next program runs.
    assert secret_file.read_text() == SECRET_FILE_TEXT
    events = run(code_canvas(HEALTHY, outputs={"msg": {"type": "String", "value": ""}}), "again")
    assert answer(events) == "still fine"


def test_the_program_sees_none_of_the_servers_environment(monkeypatch):
    monkeypatch.setenv("AGENTCANVAS_LLM_API_KEY", "sk-server-secret")
    script = "import os\ndef main():\n    return {'env': dict(os.environ), 'root': sorted(os.listdir('/')), 'uid': os.getuid()}\n"
    events = run(code_canvas(script), "x")
    out = outputs_of(events, "CodeExec:Run")["result"]
    assert set(out["env"]) <= {"PATH", "HOME", "LANG", "PWD"}
    assert "sk-server-secret" not in str(out)
    assert out["root"] == sorted(["bin", "dev", "lib", "lib64", "proc", "sandbox", "sbin", "tmp", "usr"])
    if os.geteuid() == 0:
        assert out["uid"] >= 620000  # an unprivileged uid of its own, not root
    # The server's own processes are invisible (a PID namespace of its own).
    script = "import os\ndef main():\n    return {'pids': sorted(int(p) for p in os.listdir('/proc') if p.isdigit())}\n"
    pids = outputs_of(run(code_canvas(script), "x"), "CodeExec:Run")["result"]["pids"]
    assert os.getpid() not in pids and max(pids) < 10


def test_a_cancel_stops_a_running_program_at_once():
    canvas = code_canvas("import time\ndef main():\n    time.sleep(3600)\n", timeout_seconds=60)
    flag = threading.Event()
    canvas.cancel_check = flag.is_set
    threading.Timer(0.5, flag.set).start()
    started = time.monotonic()
    done = final(run(canvas, "x"))
    assert done["status"] == "cancelled"
    assert time.monotonic() - started < 3


def test_the_turns_deadline_stops_a_program_with_a_longer_timeout():
    limits = Limits(max_seconds=1)
    canvas = code_canvas(
        "import time\ndef main():\n    time.sleep(3600)\n", limits=limits, timeout_seconds=60
    )
    started = time.monotonic()
    done = final(run(canvas, "x"))
    assert done["status"] == "failed" and "max_seconds" in done["error"]
    assert time.monotonic() - started < 3


def test_as_an_agent_tool_the_model_writes_the_program():
    with LLMServer() as llm:
        dsl = make_dsl(
            node(
                "Agent:A",
                "Agent",
                {"tools": [{"component_name": "CodeExec", "name": "CodeExec", "params": {}}]},
            ),
            node("Message:Out", "Message", {"content": ["{Agent:A@content}"]}),
        )
        canvas = Canvas(
            dsl, services={"llm_settings": llm.settings(), "tools": {"codeexec": {"timeout_seconds": 5}}}
        )
        script = "def main():\n    return {'result': sum(range(10))}\n"
        llm.queue(tool_call("CodeExec", {"lang": "python", "script": script}), text("The sum is 45."))
        events = run(canvas, "add 0..9")
        assert answer(events) == "The sum is 45."
        (request,) = [r for r in llm.chat_requests()][:1]
        spec = request["tools"][0]["function"]
        assert spec["parameters"]["required"] == ["lang", "script"]
        sent_back = llm.chat_requests()[1]["messages"][-1]
        assert sent_back["role"] == "tool" and '"result": 45' in sent_back["content"]
