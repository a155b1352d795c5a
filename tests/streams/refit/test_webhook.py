"""The re-fit service's Alertmanager webhook, and one answer per drift whichever trigger reports it.

Unit tests drive the payload parser, the HTTP endpoint (with a list for a publisher) and the
service's de-duplication (with a scripted consumer and job). The integration test at the end runs
real Prometheus, real Alertmanager (with deploy/alertmanager/alertmanager.yml) and the re-fit
service on loopback, and sees a drift alert become a published plan.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairstream.repair import datasets
from fairstream.streams.codec.refit_requests import RefitRequest
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.ops.processes import ManagedProcess, dies_with_owner
from fairstream.streams.ops.prometheus import ALERTS_YML, REPO, PrometheusServer, free_port
from fairstream.streams.refit.job import RefitJob
from fairstream.streams.refit.requests import RequestPublisher
from fairstream.streams.refit.service import ALERT_WINDOW_SECONDS, RefitService, trigger_of
from fairstream.streams.refit.sources import ResearchWindow
from fairstream.streams.refit.webhook import (
    AlertWebhook,
    WebhookConfigError,
    WebhookPayloadError,
    add_webhook_arguments,
    alert_request_id,
    alert_requests,
    load_token,
    token_matches,
    webhook_token_from_args,
    webhook_from_args,
)
from fairstream.streams.topics import ensure_topics
from tests.polling import wait_for

TOKEN = "s3cret-token-for-tests-0123456789"
ALERTMANAGER_YML = REPO / "deploy" / "alertmanager" / "alertmanager.yml"


def drift_alert(statistic="dependence_e", status="firing", starts_at="2026-01-05T10:00:00.123456789Z",
                fingerprint="9f2c0e1a7b3d4c55", name="FairstreamFairnessDrift", instance="10.0.0.7:9464",
                pipeline: str | None = "adult") -> dict:
    """One alert as Alertmanager's webhook sends it (``pipeline`` None: without that label)."""
    return {"status": status, "startsAt": starts_at, "endsAt": "0001-01-01T00:00:00Z", "fingerprint": fingerprint,
            "generatorURL": "http://prometheus:9090/graph?g0.expr=...",
            "labels": {"alertname": name, "statistic": statistic, "detector": "adwin", "instance": instance,
                       "job": "fairstream-worker", "severity": "warning",
                       **({"pipeline": pipeline} if pipeline is not None else {})},
            "annotations": {"summary": f"Fairness drift detected ({statistic}, adwin)"}}


def notification(*alerts: dict) -> dict:
    """An Alertmanager webhook payload (version 4) carrying ``alerts``."""
    return {"version": "4", "groupKey": '{}/{alertname="FairstreamFairnessDrift"}:{}', "truncatedAlerts": 0,
            "status": "firing", "receiver": "fairstream-refit", "groupLabels": {}, "commonLabels": {},
            "commonAnnotations": {}, "externalURL": "http://alertmanager:9093", "alerts": list(alerts)}


# --------------------------------------------------------------------------- token


def test_the_token_comes_from_the_file_else_the_environment_and_short_ones_are_refused(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")  # `echo token > file` leaves a newline
    assert load_token(path, environ={}) == TOKEN
    assert load_token(path, environ={"FAIRSTREAM_WEBHOOK_TOKEN": "another-token-0123456789"}) == TOKEN  # file first
    assert load_token(None, environ={"FAIRSTREAM_WEBHOOK_TOKEN": f"  {TOKEN} "}) == TOKEN
    for environ in ({}, {"FAIRSTREAM_WEBHOOK_TOKEN": ""}, {"FAIRSTREAM_WEBHOOK_TOKEN": "short-secret"}):
        with pytest.raises(WebhookConfigError, match=r"\$FAIRSTREAM_WEBHOOK_TOKEN is empty or shorter than 16") as error:
            load_token(None, environ=environ)
        assert "short-secret" not in str(error.value)  # never the value
    path.write_text("\n")
    with pytest.raises(WebhookConfigError, match=f"file {path} is empty"):
        load_token(path, environ={})
    with pytest.raises(WebhookConfigError, match="--webhook-token-file .*missing: No such file or directory"):
        load_token(tmp_path / "missing", environ={})


def test_only_the_bearer_token_itself_is_accepted():
    assert token_matches(f"Bearer {TOKEN}", TOKEN) and token_matches(f"bearer  {TOKEN} ", TOKEN)
    for header in (None, "", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer "):
        assert not token_matches(header, TOKEN), header


# --------------------------------------------------------------------------- payload


def test_a_firing_drift_alert_becomes_one_request_and_everything_else_is_skipped():
    payload = notification(
        drift_alert("dependence_e"),
        drift_alert("w1", status="resolved", fingerprint="aa"),
        drift_alert(name="FairstreamWorkerDown", fingerprint="bb"),
        drift_alert("eopp", fingerprint="cc"),
    )
    requests, skipped = alert_requests(payload, kind="plan", statistics=("dependence_e", "w1"))
    (request,) = requests
    assert request.kind == "plan" and request.statistic == "dependence_e" and request.value is None
    assert request.request_id == alert_request_id("9f2c0e1a7b3d4c55", "2026-01-05T10:00:00.123456789Z")
    assert request.ts == pytest.approx(1767607200.123457)  # startsAt: when the drift was seen
    assert request.source == "alertmanager:FairstreamFairnessDrift@10.0.0.7:9464"
    assert trigger_of(request) == "alertmanager"
    assert request.reason == "Alertmanager: Fairness drift detected (dependence_e, adwin)"
    assert skipped == [
        "alert 1: FairstreamFairnessDrift is resolved, not firing",
        "alert 2: FairstreamWorkerDown does not ask for a re-fit (only FairstreamFairnessDrift)",
        "alert 3: FairstreamFairnessDrift is for statistic 'eopp', which this pipeline does not monitor "
        "(it monitors dependence_e, w1)",
    ]


def test_repeats_of_one_firing_share_an_id_and_a_new_firing_gets_a_new_one():
    first, _ = alert_requests(notification(drift_alert()))
    repeat, _ = alert_requests(notification(drift_alert()))  # repeat_interval, a second Alertmanager, ...
    again, _ = alert_requests(notification(drift_alert(starts_at="2026-01-05T11:00:00Z")))  # fired anew
    other, _ = alert_requests(notification(drift_alert(fingerprint="0d1e")))  # another label set
    assert first[0].request_id == repeat[0].request_id
    assert len({first[0].request_id, again[0].request_id, other[0].request_id}) == 3
    assert first[0].request_id.startswith("alert-") and len(first[0].request_id) == 38


@pytest.mark.parametrize("payload, message", [
    ([], "must be a JSON object"),
    ({"version": "3", "alerts": []}, "unsupported webhook payload version '3'"),
    ({"version": "4"}, "no list of alerts"),
])
def test_a_payload_that_is_not_a_version_4_notification_is_refused(payload, message):
    with pytest.raises(WebhookPayloadError, match=message):
        alert_requests(payload)


# --------------------------------------------------------------------------- the HTTP endpoint


class Endpoint:
    """An :class:`AlertWebhook` on a free loopback port whose publisher records requests (or fails on demand)."""

    def __init__(self, **options):
        self.published: list[RefitRequest] = []
        self.fail = False
        self.webhook = AlertWebhook(self._publish, TOKEN, host="127.0.0.1", port=0, **options).start()

    def _publish(self, request: RefitRequest) -> None:
        if self.fail:
            raise ConnectionError("broker unreachable")
        self.published.append(request)

    def call(self, method: str, path: str, body: bytes | None = None, token: str | None = TOKEN,
             headers: dict | None = None) -> tuple[int, dict, dict]:
        connection = http.client.HTTPConnection("127.0.0.1", self.webhook.port, timeout=10)
        try:
            sent = {"Authorization": f"Bearer {token}"} if token else {}
            connection.request(method, path, body=body, headers={**sent, **(headers or {})})
            response = connection.getresponse()
            return response.status, json.loads(response.read() or b"{}"), dict(response.getheaders())
        finally:
            connection.close()

    def post(self, payload, **kwargs) -> tuple[int, dict, dict]:
        return self.call("POST", "/alertmanager", json.dumps(payload).encode(), **kwargs)


@pytest.fixture
def endpoint():
    served = Endpoint()
    yield served
    served.webhook.stop()


def test_an_authorised_notification_publishes_its_drift_requests(endpoint):
    status, reply, _ = endpoint.post(notification(drift_alert("dependence_e"), drift_alert("w1", fingerprint="77")))
    assert status == 200
    assert reply["published"] == [r.request_id for r in endpoint.published] and len(endpoint.published) == 2
    assert [r.statistic for r in endpoint.published] == ["dependence_e", "w1"] and reply["skipped"] == []


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789abcdef", TOKEN + "x"])
def test_a_caller_without_the_token_gets_401_and_publishes_nothing(endpoint, token):
    status, reply, headers = endpoint.post(notification(drift_alert()), token=token)
    assert status == 401 and reply == {"error": "missing or wrong bearer token"}
    assert headers["WWW-Authenticate"].startswith("Bearer") and endpoint.published == []


MALFORMED_NOTIFICATIONS = {  # body -> the start of the one-line reason
    "alerts as an object": ({**notification(), "alerts": {"0": drift_alert()}}, "the notification has no list"),
    "alerts as a string": ({**notification(), "alerts": "[]"}, "the notification has no list of alerts"),
    "no alerts": ({"version": "4"}, "the notification has no list of alerts"),
    "no version": ({"alerts": [drift_alert()]}, "unsupported webhook payload version None"),
    "a numeric version": ({**notification(drift_alert()), "version": 4}, "unsupported webhook payload version 4"),
    "a list": ([drift_alert()], "the notification must be a JSON object, got list"),
    "null": (None, "the notification must be a JSON object, got NoneType"),
    "not JSON": (b"{not json", "not UTF-8 JSON"),
    "not UTF-8": (b'{"version": "4", "alerts": [], "receiver": "\xff\xfe"}', "not UTF-8 JSON"),
    "empty": (b"", "not UTF-8 JSON"),
    "nested too deep": (b"[" * 100_000 + b"]" * 100_000, "not UTF-8 JSON"),
}


def test_bad_bodies_paths_and_methods_are_refused_and_health_needs_no_token(endpoint, caplog):
    caplog.set_level(logging.WARNING, logger="fairstream")
    for case, (body, reason) in MALFORMED_NOTIFICATIONS.items():
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        caplog.clear()
        status, reply, _ = endpoint.call("POST", "/alertmanager", data)
        assert status == 400 and reply["error"].startswith(reason) and "\n" not in reply["error"], (case, reply)
        assert f"refused an Alertmanager notification: {reason}" in caplog.text, case  # every 400 leaves a trace
    assert endpoint.post({"version": "3", "alerts": []})[:2] == (400, {"error": "unsupported webhook payload version "
                                                                                "'3' (expected '4')"})
    assert endpoint.post(notification(drift_alert()), headers={"Content-Length": "2000000"})[0] == 413
    assert endpoint.call("POST", "/elsewhere", b"{}")[0] == 404
    assert endpoint.call("GET", "/alertmanager")[0] == 405
    assert endpoint.call("GET", "/healthz", token=None)[:2] == (200, {"status": "ok"})
    assert endpoint.published == []


def test_a_request_that_cannot_be_published_is_a_503_so_alertmanager_retries(endpoint):
    endpoint.fail = True
    status, reply, _ = endpoint.post(notification(drift_alert()))
    assert status == 503 and "broker unreachable" in reply["error"] and reply["published"] == []
    endpoint.fail = False
    assert endpoint.post(notification(drift_alert()))[0] == 200 and len(endpoint.published) == 1


def test_the_token_is_never_logged_nor_shown(endpoint, caplog):
    caplog.set_level(logging.DEBUG, logger="fairstream")
    endpoint.post(notification(drift_alert()))
    endpoint.post(notification(drift_alert()), token="wrong-token-0123456789abcdef")
    endpoint.fail = True
    endpoint.post(notification(drift_alert()))
    assert caplog.records and TOKEN not in caplog.text and "wrong-token" not in caplog.text
    assert TOKEN not in repr(endpoint.webhook)


def test_the_command_line_options_start_the_webhook_only_with_serve(monkeypatch):
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", action="store_true")
    add_webhook_arguments(parser)
    args = parser.parse_args(["--serve", "--webhook-port", "0", "--webhook-host", "127.0.0.1",
                              "--triggers", "alertmanager,monitor"])
    assert args.triggers == ("alertmanager", "monitor") and parser.parse_args([]).webhook_port is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--triggers", "monitor,pager"])
    monkeypatch.setenv("FAIRSTREAM_WEBHOOK_TOKEN", TOKEN)
    with webhook_from_args(parser.parse_args([]), "127.0.0.1:1", adult_config(), "plan") as none:
        assert none is None
    without_serve = parser.parse_args(["--webhook-port", "0"])
    with pytest.raises(WebhookConfigError, match="--webhook-port needs --serve"), \
            webhook_from_args(without_serve, "127.0.0.1:1", adult_config(), "plan"):
        pass
    with webhook_from_args(args, "127.0.0.1:1", adult_config(), "flow") as served:
        assert served.kind == "flow"
        with urllib.request.urlopen(f"http://127.0.0.1:{served.port}/healthz", timeout=10) as response:
            assert response.status == 200


def test_the_webhook_options_are_checked_in_one_line_before_anything_connects(tmp_path, capsys):
    from fairstream.streams.cli import main

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    refit = ["refit", "--broker", "kafka://127.0.0.1:1"]  # nothing listens there: any connection would be the error
    cases = {
        ("--serve", "--webhook-port", "9", "--webhook-token-file", str(tmp_path / "nope")):
            f"--webhook-token-file {tmp_path / 'nope'}: No such file or directory",
        ("--webhook-port", "9", "--webhook-token-file", str(token_file)): "--webhook-port needs --serve",
        ("--serve", "--webhook-token-file", str(token_file)): "--webhook-token-file needs --webhook-port",
    }
    for extra, message in cases.items():
        assert main([*refit, *extra]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    with pytest.raises(SystemExit):
        main([*refit, "--serve", "--webhook-port", "99999"])
    assert "expected a port 0-65535" in capsys.readouterr().err


def test_a_webhook_port_already_taken_is_one_line_naming_the_address(monkeypatch):
    monkeypatch.setenv("FAIRSTREAM_WEBHOOK_TOKEN", TOKEN)
    with AlertWebhook(lambda request: None, TOKEN, host="127.0.0.1", port=0) as first:
        with pytest.raises(WebhookConfigError, match=f"cannot listen on 127.0.0.1:{first.port}: Address already in use"):
            AlertWebhook(lambda request: None, TOKEN, host="127.0.0.1", port=first.port).start()


def with_alert(**changes) -> dict:
    """A notification of one drift alert with fields replaced (``None``: removed)."""
    alert = {**drift_alert(), **changes}
    return notification({k: v for k, v in alert.items() if v is not None})


MALFORMED_ALERTS = {  # body -> the start of the one-line reason
    "annotations as a list": (with_alert(annotations=[{"summary": "drift"}]), "alert 0: annotations must be an object"),
    "annotations as a string": (with_alert(annotations="drift"), "alert 0: annotations must be an object"),
    "labels as a list": (with_alert(labels=[["alertname", "FairstreamFairnessDrift"]]), "alert 0: labels must be an"),
    "labels as a string": (with_alert(labels="FairstreamFairnessDrift"), "alert 0: labels must be an object"),
    "a label value not a string": (with_alert(labels={"alertname": "FairstreamFairnessDrift", "statistic": 3}),
                                   "alert 0: labels['statistic'] must be a string, got int"),
    "an empty statistic label": (with_alert(labels={"alertname": "FairstreamFairnessDrift", "statistic": ""}),
                                 "alert 0: FairstreamFairnessDrift: invalid refit request"),
    "no annotations": (with_alert(annotations=None), "alert 0: annotations must be an object of strings, got NoneType"),
    "no labels": (with_alert(labels=None), "alert 0: labels must be an object of strings, got NoneType"),
    "no status": (with_alert(status=None), "alert 0: status must be 'firing' or 'resolved', got None"),
    "an unknown status": (with_alert(status="pending"), "alert 0: status must be 'firing' or 'resolved'"),
    "no fingerprint": (with_alert(fingerprint=None), "alert 0: fingerprint must be a non-empty string"),
    "a numeric fingerprint": (with_alert(fingerprint=7), "alert 0: fingerprint must be a non-empty string"),
    "no startsAt": (with_alert(startsAt=None), "alert 0: startsAt must be an RFC 3339 time, got None"),
    "a startsAt in words": (with_alert(startsAt="yesterday"), "alert 0: startsAt must be an RFC 3339 time"),
    "a startsAt as a number": (with_alert(startsAt=1767607200), "alert 0: startsAt must be an RFC 3339 time"),
    "an impossible date": (with_alert(startsAt="2026-13-45T10:00:00Z"), "alert 0: startsAt must be an RFC 3339 time"),
    "an alert not an object": (notification("FairstreamFairnessDrift"), "alert 0 must be a JSON object, got str"),
    "a bad alert after a good one": (notification(drift_alert(), [1]), "alert 1 must be a JSON object, got list"),
}


@pytest.mark.parametrize("body, reason", MALFORMED_ALERTS.values(), ids=MALFORMED_ALERTS.keys())
def test_a_payload_alertmanager_could_not_have_sent_gets_400_with_a_one_line_reason(endpoint, body, reason):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, reply, _ = endpoint.call("POST", "/alertmanager", data)  # a dropped connection raises here
    assert status == 400 and reply["error"].startswith(reason) and "\n" not in reply["error"], reply
    assert len(reply["error"]) < 300 and endpoint.published == []


@pytest.fixture(scope="module")
def shared_endpoint():
    served = Endpoint()
    yield served
    served.webhook.stop()


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=3), max_leaves=8)
VALID_TYPES = {"labels": dict, "annotations": dict, "status": str, "fingerprint": str, "startsAt": str}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(sorted(VALID_TYPES)), value=JSON_VALUES)
def test_any_alert_field_of_the_wrong_type_gets_400_over_http(shared_endpoint, field, value):
    if isinstance(value, VALID_TYPES[field]):
        value = [value]  # the right type is covered above; here it is wrapped into the wrong one
    alert = {**drift_alert(), field: value}
    status, reply, _ = shared_endpoint.post(notification(drift_alert(fingerprint="ok"), alert))
    assert status == 400 and reply["error"].startswith(f"alert 1: {field}") and "\n" not in reply["error"], reply
    assert shared_endpoint.published == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=JSON_VALUES | st.fixed_dictionaries({"version": st.just("4"),
                                                    "alerts": st.lists(JSON_VALUES, min_size=1, max_size=3)}))
def test_any_json_is_answered_and_only_well_formed_alerts_are_accepted(shared_endpoint, payload):
    status, reply, _ = shared_endpoint.post(payload)
    assert (status, list(reply)) == (400, ["error"]) and "\n" not in reply["error"], reply
    assert shared_endpoint.published == []


def test_drift_of_a_statistic_the_pipeline_does_not_monitor_is_answered_and_logged_not_refit(caplog):
    caplog.set_level(logging.INFO, logger="fairstream")
    served = Endpoint(statistics=adult_config().monitor.statistics)  # dependence_e only
    try:
        status, reply, _ = served.post(notification(drift_alert("w1"), drift_alert("dependence_e", fingerprint="ab")))
    finally:
        served.webhook.stop()
    assert status == 200 and [r.statistic for r in served.published] == ["dependence_e"]
    reason = "alert 0: FairstreamFairnessDrift is for statistic 'w1', which this pipeline does not monitor"
    assert reply["skipped"][0].startswith(reason) and reason in caplog.text


def test_only_alerts_of_its_own_pipeline_become_requests_and_the_others_are_answered_and_logged(caplog):
    caplog.set_level(logging.INFO, logger="fairstream")
    served = Endpoint(pipeline="adult")
    try:
        status, reply, _ = served.post(notification(drift_alert(pipeline="census"),
                                                    drift_alert(pipeline=None, fingerprint="ab"),
                                                    drift_alert(fingerprint="cd")))
    finally:
        served.webhook.stop()
    assert status == 200 and [r.request_id for r in served.published] == [alert_request_id(
        "cd", "2026-01-05T10:00:00.123456789Z")]
    assert reply["skipped"] == [
        "alert 0: FairstreamFairnessDrift is for pipeline 'census', not this service's 'adult'",
        "alert 1: FairstreamFairnessDrift has no pipeline label (this service re-fits pipeline 'adult' only)"]
    assert all(reason in caplog.text for reason in reply["skipped"])


def test_the_command_line_webhook_re_fits_only_the_monitored_statistics(monkeypatch):
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", action="store_true")
    add_webhook_arguments(parser)
    monkeypatch.setenv("FAIRSTREAM_WEBHOOK_TOKEN", TOKEN)
    args = parser.parse_args(["--serve", "--webhook-port", "0", "--webhook-host", "127.0.0.1"])
    config = adult_config()
    with webhook_from_args(args, "127.0.0.1:1", config, "plan") as served:
        assert served.statistics == config.monitor.statistics == ("dependence_e",)
        assert served.pipeline == config.name == "adult"


# --------------------------------------------------------------------------- one answer per drift


class ScriptedConsumer:
    """Stands in for the service's Kafka consumer: hands out queued messages, counts commits."""

    def __init__(self):
        self.queue: list[SimpleNamespace] = []
        self.commits = 0

    def send(self, request: RefitRequest) -> None:
        offset = len(self.queue)
        self.queue.append(SimpleNamespace(topic="refit.requests", partition=0, offset=offset,
                                          timestamp=offset, value=request.to_json()))

    def poll(self, timeout_ms, max_records):
        batch, self.queue = self.queue, []
        return {0: batch} if batch else {}

    def assignment(self):
        return {0}

    def commit(self):
        self.commits += 1

    def close(self):
        pass


class CountingJob:
    """Stands in for a :class:`RefitJob` of plans: counts its runs."""

    kind = "plan"
    config = adult_config()

    def __init__(self):
        self.runs = 0

    def run_once(self, source, trigger=None):
        self.runs += 1
        return SimpleNamespace(reason=f"re-fit {self.runs}")


def service(**options) -> tuple[RefitService, ScriptedConsumer, CountingJob]:
    job, consumer = CountingJob(), ScriptedConsumer()
    refit = RefitService(job, source=None, min_interval_seconds=0, **options)
    refit._consumer = consumer  # what _open() would have connected
    return refit, consumer, job


def monitor_request(statistic="dependence_e", ts=None) -> RefitRequest:
    """A request as the worker's monitor sends it (streams/worker/app.py)."""
    return RefitRequest.new(f"drift of {statistic}", statistic=statistic, value=0.3, source="monitor@fairstream-adult",
                            ts=ts)


def alert_request(statistic="dependence_e", ts=None, fingerprint="9f2c") -> RefitRequest:
    """A request as the webhook makes it from a firing alert that started at ``ts``."""
    starts_at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts or time.time())) + "Z"
    (request,), _ = alert_requests(notification(drift_alert(statistic, starts_at=starts_at, fingerprint=fingerprint)))
    return request


def answer(refit: RefitService, consumer: ScriptedConsumer, *requests: RefitRequest) -> None:
    for request in requests:
        consumer.send(request)
        refit.process_pending(timeout=5, idle_seconds=0)


def actions(refit: RefitService, request: RefitRequest) -> list[tuple[str, str]]:
    return [(d.action, d.reason) for d in refit.decisions if d.request_id == request.request_id]


def test_the_monitor_and_the_alert_for_one_drift_are_answered_by_one_refit():
    refit, consumer, job = service()
    now = float(int(time.time()))  # an alert's startsAt in whole seconds, as alert_request writes it
    monitor, alert = monitor_request(ts=now), alert_request(ts=now + 20)  # the alert fires after a scrape or two
    answer(refit, consumer, monitor, alert)
    assert job.runs == 1
    ((action, reason),) = actions(refit, alert)
    assert action == "duplicate" and f"as monitor request {monitor.request_id} (20s apart)" in reason


def test_an_alert_answered_first_makes_the_monitors_late_request_a_duplicate():
    refit, consumer, job = service()
    now = time.time()
    alert, monitor = alert_request(ts=now), monitor_request(ts=now - 30)  # the monitor's send was slow to arrive
    answer(refit, consumer, alert, monitor)
    assert job.runs == 1 and actions(refit, monitor)[0][0] == "duplicate"


def test_drift_of_another_statistic_or_outside_the_window_is_a_new_drift():
    refit, consumer, job = service()
    now = time.time()
    answer(refit, consumer, monitor_request("dependence_e", ts=now - ALERT_WINDOW_SECONDS - 60),
           alert_request("w1", ts=now - 10),  # another statistic
           alert_request("dependence_e", ts=now, fingerprint="ee"))  # 7 minutes after the monitor's request
    assert job.runs == 3
    # the clock-skew allowance is small: an alert starting well before the monitor's request is not its twin
    refit, consumer, job = service()
    answer(refit, consumer, alert_request(ts=now - 120), monitor_request(ts=now))
    assert job.runs == 2


def test_repeats_of_an_alert_are_dropped_by_id():
    refit, consumer, job = service()
    alert = alert_request()
    answer(refit, consumer, alert, alert, alert)
    assert job.runs == 1 and [a for a, _ in actions(refit, alert)] == ["queued", "duplicate", "duplicate"]


def test_a_deployment_chooses_its_triggers():
    refit, consumer, job = service(triggers=("alertmanager",))
    monitor, alert = monitor_request(), alert_request()
    manual = RefitRequest.new("asked by hand", source="operator")
    answer(refit, consumer, monitor, manual, alert)
    assert job.runs == 1 and actions(refit, alert)[0][0] == "queued"
    assert actions(refit, monitor) == [("ignored", "sent by the monitor trigger; this service answers alertmanager")]
    assert actions(refit, manual)[0][0] == "ignored"
    refit, consumer, job = service(triggers=("monitor", "other"))
    answer(refit, consumer, monitor, manual, alert)
    assert job.runs == 2 and actions(refit, alert)[0][0] == "ignored"  # a manual request is never a twin
    with pytest.raises(ValueError, match="triggers must be some of monitor, alertmanager, other"):
        service(triggers=("pager",))


def test_the_monitoring_agent_signs_its_requests_as_the_service_expects():
    from fairstream.streams.agent.service import MonitoringAgent

    agent = MonitoringAgent(adult_config())  # it asks the pipeline's re-fits now, under its own name
    assert trigger_of(RefitRequest.new("drift", source=agent.name)) == "monitor"
    assert trigger_of(monitor_request()) == "monitor"  # a worker's request from before the agent still counts
    assert trigger_of(RefitRequest.new("by hand")) == "other"


# --------------------------------------------------------------------------- the real route


class AlertmanagerServer(ManagedProcess):
    """``prometheus-alertmanager`` (Debian package) on a free loopback port, with the given config, no cluster."""

    error = RuntimeError

    def __init__(self, run_dir: Path, config: dict):
        self.run_dir = run_dir
        super().__init__(run_dir / "alertmanager.log")
        self.config = config
        self.port = None

    def _command(self) -> list[str]:
        binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
        if binary is None:
            raise RuntimeError("prometheus-alertmanager not found: run `make setup` (Debian package prometheus-alertmanager)")
        return [*dies_with_owner([binary]), f"--config.file={self.run_dir / 'alertmanager.yml'}",
                f"--storage.path={self.run_dir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address="]

    def start(self) -> AlertmanagerServer:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "alertmanager.yml").write_text(yaml.safe_dump(self.config))
        self.port = free_port()
        self._spawn("alertmanager")
        self._wait_until(lambda: self._get("/-/ready") is not None, "alertmanager")
        return self

    def _get(self, path: str):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as response:
                return response.read()
        except OSError:
            return None

    def alerts(self) -> list[dict]:
        return json.loads(self._get("/api/v2/alerts") or b"[]")


class PrometheusWithAlertmanager(PrometheusServer):
    """The test harness's Prometheus, also sending its alerts to one Alertmanager."""

    def __init__(self, *args, alertmanager: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.alertmanager = alertmanager

    def _config(self) -> dict:
        return {**super()._config(), "alerting": {"alertmanagers": [{"static_configs": [{"targets": [self.alertmanager]}]}]}}


def alertmanager_config_for(port: int, token_file: Path) -> dict:
    """deploy/alertmanager/alertmanager.yml with only the webhook's URL and token file pointed at this test."""
    config = yaml.safe_load(ALERTMANAGER_YML.read_text())
    (receiver,) = [r for r in config["receivers"] if r["name"] == "fairstream-refit"]
    (hook,) = receiver["webhook_configs"]
    assert hook["url"] == "http://fairstream-refit:9095/alertmanager"
    hook["url"] = f"http://127.0.0.1:{port}/alertmanager"
    hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    return config


EXPORTER = r"""
import sys
from fairstream.streams.worker import metrics

metrics.serve(int(sys.argv[1]), "127.0.0.1")
drift_events = metrics.PipelineMetrics(sys.argv[2]).drift_events
for statistic in ("dependence_e", "w1"):
    drift_events.labels(statistic, "adwin").inc(0)  # as the worker does at start
print("ready", flush=True)
for line in sys.stdin:
    drift_events.labels(line.strip(), "adwin").inc()
    print("drifted", flush=True)
"""


class DriftExporter:
    """A stand-in worker: the real drift counter on /metrics, incremented per statistic on stdin."""

    def __init__(self, pipeline: str):
        self.port = free_port()
        self.process = subprocess.Popen([sys.executable, "-c", EXPORTER, str(self.port), pipeline],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "ready"

    def drift(self, statistic: str) -> None:
        self.process.stdin.write(statistic + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "drifted"

    def stop(self) -> None:
        self.process.stdin.close()  # EOF ends it
        self.process.wait(10)
        self.process.stdout.close()


@pytest.fixture(scope="module")
def route(broker, tmp_path_factory):
    """Exporter -> Prometheus (real rules) -> Alertmanager (real config) -> webhook -> refit.requests -> service."""
    run_dir = tmp_path_factory.mktemp("route")
    config = adult_config(artifact_dir=str(run_dir / "artifacts")).with_topics(prefix=f"route-{uuid.uuid4().hex[:8]}")
    ensure_topics(broker.bootstrap, config.topics)
    research, _ = datasets.load("adult").split(3000, seed=0)
    job = RefitJob(config, broker.bootstrap, n_q=50)
    refit = RefitService(job, ResearchWindow.of(research.X, research.s, research.u), min_interval_seconds=0,
                         poll_seconds=0.2)
    token_file = run_dir / "token"
    token_file.write_text(TOKEN)
    os.chmod(token_file, 0o600)
    stop, exporter = threading.Event(), DriftExporter(config.name)
    thread = threading.Thread(target=refit.serve, args=(stop,), daemon=True)
    thread.start()
    publisher = RequestPublisher(broker.bootstrap, config.topics.refit_requests)
    try:
        with AlertWebhook(publisher, load_token(token_file), host="127.0.0.1", port=0, pipeline=config.name) as hook, \
                AlertmanagerServer(run_dir / "am", alertmanager_config_for(hook.port, token_file)) as am, \
                PrometheusWithAlertmanager(run_dir / "prom", [f"127.0.0.1:{exporter.port}"], [ALERTS_YML],
                                           alertmanager=f"127.0.0.1:{am.port}") as prom:
            prom.wait_for_targets_up()
            yield SimpleNamespace(config=config, broker=broker, refit=refit, exporter=exporter, prom=prom, am=am,
                                  publisher=publisher)
    finally:
        stop.set()
        thread.join(30)
        publisher.close()
        exporter.stop()


def decisions_of(refit: RefitService, prefix: str) -> list:
    return [d for d in refit.decisions.copy() if (d.request_id or "").startswith(prefix)]


def scraped(route, statistic: str) -> bool:
    """Prometheus holds the drift counter of ``statistic`` at 0: an increase from now on is seen."""
    return bool(route.prom.values(f'fairstream_drift_events_total{{statistic="{statistic}"}} == 0'))


@pytest.mark.integration
def test_a_drift_alert_becomes_a_published_plan(route):
    wait_for(lambda: scraped(route, "dependence_e"), 30, "scrape of the drift counter")
    route.exporter.drift("dependence_e")

    route.prom.wait_for_alert("FairstreamFairnessDrift", "firing", 30, labels={"statistic": "dependence_e"})
    (queued,) = wait_for(lambda: decisions_of(route.refit, "alert-"), 30, "re-fit request from Alertmanager")
    assert queued.action == "queued"
    wait_for(lambda: route.refit.outcomes, 60, "re-fit")
    (record,) = ControlClient(route.broker.bootstrap, route.config.topics,
                              ArtifactStore(route.config.artifact_dir)).history_sync()
    assert record.kind == "plan" and record.version == 1
    answered = [d for d in route.refit.decisions.copy() if d.action == "refit"]
    assert len(answered) == 1 and queued.request_id in answered[0].reason and "published plan v1" in answered[0].reason
    # the request came through Alertmanager, which holds the alert Prometheus sent
    (held,) = [a for a in route.am.alerts() if a["labels"].get("statistic") == "dependence_e"]
    assert held["labels"]["alertname"] == "FairstreamFairnessDrift" and held["status"]["state"] == "active"


@pytest.mark.integration
def test_the_monitors_request_and_the_alert_for_one_drift_give_one_refit(route):
    wait_for(lambda: scraped(route, "w1"), 30, "scrape of the drift counter")
    refits_before = len(route.refit.outcomes)
    seen_before = {d.request_id for d in decisions_of(route.refit, "alert-")}
    monitor = route.publisher(monitor_request("w1"))  # what the worker sends when it counts the event
    route.exporter.drift("w1")

    def alert_handled():
        return [d for d in decisions_of(route.refit, "alert-") if d.request_id not in seen_before]

    (duplicate,) = wait_for(alert_handled, 45, "the drift alert's request")
    assert duplicate.action == "duplicate" and f"as monitor request {monitor.request_id}" in duplicate.reason
    wait_for(lambda: len(route.refit.outcomes) > refits_before, 30, "the monitor's re-fit")
    time.sleep(1.0)  # a second re-fit, were there one, would have started by now (min interval 0)
    assert len(route.refit.outcomes) == refits_before + 1


def test_with_tls_the_webhook_serves_https_only_and_the_token_still_decides(tmp_path):
    import socket
    import ssl

    from fairstream.streams.ops.kafka_cluster import make_loopback_tls

    ca, server = make_loopback_tls(tmp_path)
    published = []
    with AlertWebhook(published.append, TOKEN, host="127.0.0.1", port=0, tls=(str(server), str(server))) as webhook:
        trusted = ssl.create_default_context(cafile=str(ca))

        def post(token: str) -> int:
            connection = http.client.HTTPSConnection("127.0.0.1", webhook.port, timeout=10, context=trusted)
            try:
                connection.request("POST", "/alertmanager", body=json.dumps(notification(drift_alert())).encode(),
                                   headers={"Authorization": f"Bearer {token}"})
                return connection.getresponse().status
            finally:
                connection.close()

        assert post("wrong-token-0123456789abcdef") == 401 and published == []
        assert post(TOKEN) == 200 and len(published) == 1
        plain = http.client.HTTPConnection("127.0.0.1", webhook.port, timeout=10)  # the token never goes in clear
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            plain.request("GET", "/healthz")
            plain.getresponse()
        plain.close()
        with pytest.raises(ssl.SSLError):  # a client that does not trust the certificate is refused by TLS itself
            with socket.create_connection(("127.0.0.1", webhook.port)) as raw:
                ssl.create_default_context().wrap_socket(raw, server_hostname="127.0.0.1")


def test_the_webhook_binds_this_host_only_by_default_and_tls_options_go_together(tmp_path):
    parser = argparse.ArgumentParser()
    add_webhook_arguments(parser)
    parser.add_argument("--serve", action="store_true")
    assert parser.parse_args([]).webhook_host == "127.0.0.1"
    assert AlertWebhook(lambda request: None, TOKEN).host == "127.0.0.1"
    with pytest.raises(WebhookConfigError, match="--webhook-tls-cert and --webhook-tls-key go together"):
        webhook_token_from_args(parser.parse_args(["--serve", "--webhook-port", "0", "--webhook-tls-cert", "c.pem"]))
    with pytest.raises(WebhookConfigError, match="^--webhook-tls-key needs --webhook-port"):
        webhook_token_from_args(parser.parse_args(["--webhook-tls-key", "k.pem"]))
