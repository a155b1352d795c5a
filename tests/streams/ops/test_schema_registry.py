"""The Schema Registry run by the project: Apicurio Registry fetched through Maven once, started, serving the
Confluent-compatible API, stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request

import pytest

from fairstream.streams.ops import schema_registry as module
from fairstream.streams.ops.processes import free_port, is_alive
from fairstream.streams.ops.schema_registry import (CCOMPAT_PATH, REGISTRY_VERSION, SchemaRegistry,
                                                    SchemaRegistryError, fetch_registry)
from tests.polling import wait_for
from tests.streams.test_cli import background, fairstream

LOAN_SCHEMA = {"type": "record", "name": "Loan", "fields": [{"name": "application_id", "type": "string"}]}
CONFLUENT_JSON = "application/vnd.schemaregistry.v1+json"


def call(url: str, method: str = "GET", body: dict | None = None):
    """(status, parsed JSON) of one request to the registry's Confluent-compatible API."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": CONFLUENT_JSON})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_the_release_is_fetched_once_into_the_cache_outside_the_checkout(monkeypatch):
    jar = fetch_registry()  # `make test` fetched it already, or this does
    assert jar.is_file() and jar.name == f"apicurio-registry-app-{REGISTRY_VERSION}-runner.jar"
    assert (jar.parent / "lib").is_dir() and not str(jar).startswith(os.getcwd())
    monkeypatch.setattr(module, "_fetch_distribution",
                        lambda *args: pytest.fail("fetched again although the release is in the cache"))
    assert fetch_registry() == jar


def test_maven_fetches_with_checksums_enforced_and_a_failure_is_one_line_naming_the_release(monkeypatch, tmp_path):
    seen = []

    def maven(command, **kwargs):
        seen.append(command)
        return subprocess.CompletedProcess(command, 1, "[ERROR] Could not find artifact io.apicurio:x\n", "")

    monkeypatch.setattr(module.subprocess, "run", maven)
    with pytest.raises(SchemaRegistryError,
                       match=r"^fetching Apicurio Registry 9\.9\.9 through Maven failed: \[ERROR\] Could not find"):
        fetch_registry("9.9.9", cache=tmp_path)
    assert "-C" in seen[0] and "-Dartifact=io.apicurio:apicurio-registry-app:9.9.9:tar.gz:all" in seen[0]
    assert not (tmp_path / "apicurio-registry-9.9.9").exists()  # nothing half-fetched is taken for a release


def test_the_session_registry_serves_the_confluent_api_with_backward_compatibility(schema_registry):
    assert schema_registry.url.endswith(CCOMPAT_PATH) and schema_registry.host == "127.0.0.1"
    subject = f"{schema_registry.url}/subjects/ops-smoke-value"
    assert call(f"{schema_registry.url}/config/ops-smoke-value", "PUT", {"compatibility": "BACKWARD"}) == \
        (200, {"compatibility": "BACKWARD"})
    status, registered = call(f"{subject}/versions", "POST", {"schema": json.dumps(LOAN_SCHEMA)})
    assert status == 200 and isinstance(registered["id"], int)
    status, by_id = call(f"{schema_registry.url}/schemas/ids/{registered['id']}")
    assert status == 200 and json.loads(by_id["schema"]) == LOAN_SCHEMA
    required_field = {**LOAN_SCHEMA, "fields": [*LOAN_SCHEMA["fields"], {"name": "amount", "type": "int"}]}
    status, refused = call(f"{subject}/versions", "POST", {"schema": json.dumps(required_field)})
    assert status == 409, refused  # a new field without a default cannot read the old records: not BACKWARD


def test_a_registry_starts_on_its_port_and_stops_without_leaving_its_jvm(tmp_path):
    registry = SchemaRegistry(tmp_path).start()
    pid = registry.pid
    try:
        assert registry.answers() and is_alive(pid)
        with pytest.raises(SchemaRegistryError, match=f"port 127.0.0.1:{registry.port} is taken"):
            SchemaRegistry(tmp_path / "second", port=registry.port).start()
    finally:
        registry.stop()
    assert not registry.answers() and not is_alive(pid) and not registry.running


def test_the_command_fetches_and_runs_a_registry_in_the_foreground(tmp_path):
    assert fairstream("schema-registry", "fetch", cwd=tmp_path).stdout.strip() == str(fetch_registry())
    port = free_port()
    with background("schema-registry", "start", "--port", str(port), "--run-dir", str(tmp_path), cwd=tmp_path) as run:
        url = f"http://127.0.0.1:{port}{CCOMPAT_PATH}"
        wait_for(lambda: f"[schema_registry] url = \"{url}\"" in (tmp_path / "out.log").read_text(), 120,
                 "the registry's URL on the command's output")
        assert call(f"{url}/subjects") == (200, [])
        run.send_signal(signal.SIGINT)  # Ctrl-C
        assert run.wait(timeout=60) == 0
