"""schemathesis fuzzes every route of the OpenAPI document against a real server:
no answer is a 500, and no answer breaks the schema the document gives it.

The server holds one agent (the greeting sample) so that some generated requests
reach real work; most generated ids are unknown and answered 404, which is fine.
Runs the fuzzing phase with a few examples per operation (tens of seconds; the coverage
phase passes too but takes minutes on a shared machine: `schemathesis run` it by hand).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import SAMPLES

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"


def test_schemathesis_finds_no_server_error_and_no_schema_breaking_answer(deployment, tmp_path):
    token = deployment.token()
    deployment.import_agent(SAMPLES / "greeting.json")
    server = deployment.server(workers=1, threads=8)
    run = subprocess.run(
        [str(SCHEMATHESIS), "run", f"{server.url}/api/v1/openapi.json"]
        + ["--header", f"Authorization: Bearer {token}"]
        + ["--checks", "not_a_server_error,response_schema_conformance"]
        + ["--phases", "fuzzing", "--max-examples", "3", "--request-timeout", "30"]
        + ["--generation-deterministic", "--no-color"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:] + server.log()[-3000:]
    assert "passed" in run.stdout
