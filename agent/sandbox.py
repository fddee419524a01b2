"""Run an untrusted Python or JavaScript program in a sandbox (CodeExec's engine).

    result = run_program("python", script, {"a": 1}, deadline=canvas.deadline, limits=SandboxLimits())
    result.value        # what main(**arguments) returned (JSON data)

The program is RAGFlow's shape: Python defines ``main(**arguments)``, JavaScript
exports ``main(args)`` (``module.exports = { main }``; it may return a Promise). Its
return value must be JSON data; what it prints is kept as ``stdout``/``stderr``.

The sandbox is Debian's ``bubblewrap`` (``bwrap``):

* **new namespaces** (user, PID, network, IPC, UTS, cgroup): no network at all (only
  a loopback of its own), no view of the server's processes;
* **a minimal, read-only file system**: ``/usr`` (and the ``/bin``, ``/lib`` links)
  read-only, a fresh ``/proc`` and ``/dev``, a small private ``/tmp`` and the program
  itself read-only under ``/sandbox``. Nothing of the server's files, home or working
  directory is there;
* **no inherited environment**: only ``PATH``, ``HOME=/tmp`` and ``LANG``;
* **rlimits**: CPU seconds, address space, processes, file size and open files. As
  root each run gets a fresh unprivileged uid (from ``tools.codeexec.uid_base``), so
  the process limit counts that run's processes only;
* **output and time**: stdout and stderr together are capped (the program is killed
  past the cap), and the run obeys the turn's deadline and cancel and its own
  ``timeout_seconds``; killing the sandbox's first process ends every process in it.

Every broken limit ends with :class:`SandboxError` saying which limit, in words.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, fields
from typing import Any

from agent.deadline import Deadline
from agent.errors import ComponentError, ComponentTimeout

LANGUAGES = {"python": "python", "python3": "python", "javascript": "javascript", "nodejs": "javascript"}
RESULT_MARKER = "__agentcanvas_result__:"
_MB = 1024 * 1024

# Reads main.py from the read-only /sandbox, calls main(**arguments), prints the result.
_PYTHON_RUNNER = r"""
import base64, json, sys
with open("/sandbox/arguments.json", encoding="utf-8") as fh:
    arguments = json.load(fh)
with open("/sandbox/main.py", encoding="utf-8") as fh:
    code = compile(fh.read(), "/sandbox/main.py", "exec")
namespace = {"__name__": "__main__", "__file__": "/sandbox/main.py"}
exec(code, namespace)
main = namespace.get("main")
if not callable(main):
    sys.exit("agentcanvas: the script defines no main() function")
result = main(**arguments)
try:
    payload = json.dumps(result, ensure_ascii=False)
except (TypeError, ValueError) as e:
    sys.exit(f"agentcanvas: main() returned a value that is not JSON data ({e})")
sys.stdout.flush()
print("\n" + MARKER + base64.b64encode(payload.encode()).decode(), flush=True)
""".replace("MARKER", repr(RESULT_MARKER))

_JAVASCRIPT_RUNNER = r"""
const fs = require('fs');
const args = JSON.parse(fs.readFileSync('/sandbox/arguments.json', 'utf8'));
const mod = require('/sandbox/main.js');
const main = typeof mod === 'function' ? mod : mod && mod.main;
if (typeof main !== 'function') {
  console.error('agentcanvas: the script exports no main function (module.exports = { main })');
  process.exit(1);
}
Promise.resolve().then(() => main(args)).then((value) => {
  if (typeof value === 'undefined') value = null;
  const payload = JSON.stringify(value);
  if (typeof payload === 'undefined') {
    console.error('agentcanvas: main() returned a value that is not JSON data');
    process.exit(1);
  }
  process.stdout.write('\n' + MARKER + Buffer.from(payload, 'utf8').toString('base64') + '\n');
}, (err) => {
  console.error((err && err.stack) || String(err));
  process.exit(1);
});
""".replace("MARKER", json.dumps(RESULT_MARKER))

# Signs in stderr that the program hit the memory limit (Python, V8, C++ runtime).
_OUT_OF_MEMORY = (
    "MemoryError",
    "heap out of memory",
    "Fatal process OOM",
    "std::bad_alloc",
    "Array buffer allocation failed",
    "Cannot allocate memory",
)


class SandboxError(ComponentError):
    """The program failed or broke a limit; the message says which, in words."""

    def __init__(self, message: str, stdout: str = "", stderr: str = ""):
        super().__init__(message, retryable=False)
        self.stdout = stdout
        self.stderr = stderr


@dataclass
class SandboxLimits:
    """Limits of one run (``tools.codeexec.*`` in the settings)."""

    timeout_seconds: float = 30.0
    cpu_seconds: int = 30
    memory_mb: int = 512
    max_processes: int = 32
    max_file_bytes: int = 16 * _MB
    tmp_bytes: int = 64 * _MB
    max_output_bytes: int = 1 * _MB
    max_open_files: int = 64
    #: As root, each run gets its own unprivileged uid from ``uid_base`` on (no account
    #: needed), so the process limit counts that run's processes only.
    uid_base: int = 620000
    bwrap: str = "bwrap"
    python: str = "/usr/bin/python3"
    node: str = "/usr/bin/node"

    @classmethod
    def from_mapping(cls, values: dict | None) -> SandboxLimits:
        out = cls()
        for f in fields(cls):
            if values and values.get(f.name) not in (None, ""):
                setattr(out, f.name, type(getattr(out, f.name))(values[f.name]))
        return out


@dataclass
class ProgramResult:
    value: Any
    stdout: str
    stderr: str
    elapsed: float


def language_of(lang: Any) -> str:
    """``python`` or ``javascript`` for RAGFlow's spellings; ``ValueError`` otherwise."""
    found = LANGUAGES.get(str(lang).strip().lower()) if isinstance(lang, str) else None
    if found is None:
        raise ValueError(f"lang {lang!r} is not one of 'python', 'javascript' (also 'python3', 'nodejs')")
    return found


def available(limits: SandboxLimits | None = None) -> str | None:
    """Why the sandbox cannot run here (``None`` when it can)."""
    limits = limits or SandboxLimits()
    if shutil.which(limits.bwrap) is None:
        return f"bubblewrap ({limits.bwrap!r}) is not installed; install Debian's 'bubblewrap' (make sandbox)"
    return None


def run_program(
    language: str, script: str, arguments: dict, *, deadline: Deadline, limits: SandboxLimits
) -> ProgramResult:
    """Run ``script`` in the sandbox; see the module docstring.

    Raises:
        SandboxError: the program failed, printed too much, ran out of memory, CPU or
            time (``timeout_seconds``), or the sandbox is missing.
        agent.errors.Cancelled, agent.errors.DeadlineExceeded: from ``deadline``.
    """
    language = language_of(language)
    missing = available(limits)
    if missing:
        raise SandboxError(missing)
    try:
        args_json = json.dumps(arguments, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise SandboxError(f"the arguments are not JSON data: {e}") from None
    wait = deadline.within(limits.timeout_seconds, "tools.codeexec.timeout_seconds")
    wait.check()
    with tempfile.TemporaryDirectory(prefix="agentcanvas-sandbox-") as workdir:
        os.chmod(workdir, 0o755)
        name = "main.py" if language == "python" else "main.js"
        runner = _PYTHON_RUNNER if language == "python" else _JAVASCRIPT_RUNNER
        for filename, text in ((name, script), ("runner", runner), ("arguments.json", args_json)):
            with open(os.path.join(workdir, filename), "w", encoding="utf-8") as fh:
                fh.write(text)
            os.chmod(os.path.join(workdir, filename), 0o644)
        command = _rlimits(limits, language) + _bwrap_command(language, workdir, limits)
        started = time.monotonic()
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            close_fds=True,
            start_new_session=True,
            **_run_as(limits),
        )
        try:
            stdout, stderr, overflow = _collect(proc, wait, limits.max_output_bytes)
        except ComponentTimeout:
            raise SandboxError(
                f"the program ran longer than {limits.timeout_seconds:g} s and was stopped "
                f"(tools.codeexec.timeout_seconds)"
            ) from None
        finally:
            _kill(proc)
        elapsed = time.monotonic() - started
    out = stdout.decode("utf-8", errors="replace")
    err = stderr.decode("utf-8", errors="replace")
    if overflow:
        raise SandboxError(
            f"the program printed more than {limits.max_output_bytes} bytes and was stopped "
            f"(tools.codeexec.max_output_bytes)",
            out[:2000],
            err[:2000],
        )
    return _result(proc.returncode, out, err, elapsed, limits, language)


def _bwrap_command(language: str, workdir: str, limits: SandboxLimits) -> list[str]:
    if language == "python":
        program = [limits.python, "-I", "-B", "/sandbox/runner"]
    else:
        program = [limits.node, f"--max-old-space-size={limits.memory_mb}", "/sandbox/runner"]
    command = [
        shutil.which(limits.bwrap) or limits.bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for link in ("bin", "sbin", "lib", "lib64", "lib32"):
        if os.path.islink(f"/{link}"):
            command += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
        elif os.path.isdir(f"/{link}") and not os.path.isdir(f"/usr/{link}"):
            command += ["--ro-bind", f"/{link}", f"/{link}"]
    command += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(limits.tmp_bytes),
        "--tmpfs",
        "/tmp",
        "--ro-bind",
        workdir,
        "/sandbox",
        "--chdir",
        "/tmp",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--",
        *program,
    ]
    return command


_UID_LOCK = threading.Lock()
_uid_counter = 0


def _run_as(limits: SandboxLimits) -> dict:
    """As root, run as a fresh unprivileged uid (distinct per run in this process and
    per process), so one run's fork bomb cannot use up another's process limit;
    otherwise as the server's own user."""
    global _uid_counter
    if os.geteuid() != 0:
        return {}
    with _UID_LOCK:
        _uid_counter = (_uid_counter + 1) % 1000
        uid = limits.uid_base + (os.getpid() % 10000) * 1000 + _uid_counter
    return {"user": uid, "group": uid, "extra_groups": []}


def _rlimits(limits: SandboxLimits, language: str) -> list[str]:
    """util-linux's ``prlimit`` setting the limits before it starts bwrap (a
    ``preexec_fn`` is unsafe in a threaded server)."""
    memory = limits.memory_mb * _MB
    if language == "javascript":
        memory += 1024 * _MB  # V8 reserves address space up front; its heap is capped by flag
    processes = limits.max_processes
    if os.geteuid() != 0:
        # The limit counts every process of the user: leave room for the server's own.
        processes += _processes_of(os.getuid())
    return [
        shutil.which("prlimit") or "prlimit",
        f"--cpu={limits.cpu_seconds}",
        f"--as={memory}",
        f"--nproc={processes}",
        f"--fsize={limits.max_file_bytes}",
        f"--nofile={limits.max_open_files}",
        "--core=0",
        "--",
    ]


def _processes_of(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
            except OSError:
                continue
    return count


def _collect(proc: subprocess.Popen, wait: Deadline, cap: int) -> tuple[bytes, bytes, bool]:
    """Read stdout and stderr until the program ends; stop at ``cap`` bytes in all."""
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    open_fds = set(buffers)
    total = 0
    while open_fds:
        wait.check()
        ready, _, _ = select.select(list(open_fds), [], [], wait.step() or 0.001)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                continue
            total += len(chunk)
            if total > cap:
                return bytes(buffers[proc.stdout.fileno()]), bytes(buffers[proc.stderr.fileno()]), True
            buffers[fd] += chunk
    while proc.poll() is None:
        wait.check()
        time.sleep(0.005)
    return bytes(buffers[proc.stdout.fileno()]), bytes(buffers[proc.stderr.fileno()]), False


def _kill(proc: subprocess.Popen) -> None:
    """End the sandbox: killing bwrap ends its PID namespace and everything in it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _result(
    code: int, out: str, err: str, elapsed: float, limits: SandboxLimits, language: str
) -> ProgramResult:
    head, marker, tail = out.rpartition("\n" + RESULT_MARKER)
    if code == 0 and marker:
        payload = tail.strip()
        value = json.loads(base64.b64decode(payload).decode("utf-8"))
        return ProgramResult(value, head, err, elapsed)
    last = _summary(err, language) or _summary(out, language)
    if code in (-signal.SIGXCPU, 128 + signal.SIGXCPU) or code == -signal.SIGKILL and "CPU" in err:
        reason = f"the program used more than {limits.cpu_seconds} s of CPU (tools.codeexec.cpu_seconds)"
    elif code in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ) or "File too large" in err:
        reason = f"the program wrote a file larger than {limits.max_file_bytes} bytes (tools.codeexec.max_file_bytes)"
    elif err.startswith("bwrap:"):
        reason = f"the sandbox could not start ({err.strip()[:300]})"
        last = ""
    elif any(sign in err for sign in _OUT_OF_MEMORY):
        reason = f"the program ran out of memory (limit {limits.memory_mb} MB, tools.codeexec.memory_mb)"
    elif "Resource temporarily unavailable" in err or "EAGAIN" in err:
        reason = (
            f"the program started more processes than allowed ({limits.max_processes}, "
            f"tools.codeexec.max_processes)"
        )
    elif "agentcanvas: " in err:
        reason = err[err.rindex("agentcanvas: ") + len("agentcanvas: ") :].strip()
    elif code == 0:
        reason = "the program ended without returning a result from main()"
    else:
        reason = f"the {language} program failed (exit status {code})"
    if last and "agentcanvas: " not in last:
        reason += f": {last}"
    raise SandboxError(reason, out[:2000], err[:2000])


def _summary(text: str, language: str, width: int = 500) -> str:
    """The line of a failure's output that says what went wrong: Python's last line
    (the exception), JavaScript's first (the error above its stack)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if language == "javascript":
        named = [line for line in lines if "Error" in line and not line.startswith("at ")]
        return (named or lines)[0][:width]
    return lines[-1][:width]
