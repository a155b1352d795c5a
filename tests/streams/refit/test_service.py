"""The re-fit service and the version a request is about: a drift measured on a replaced version is dropped.

The monitoring agent names, in each re-fit request, the version of the kind serving when it confirmed the drift.
The service reads what serves now from the control topic (``RefitJob.current``); a request about a version that
no longer serves is dropped with one warning, and a request without a version is answered as before. The service
runs here on a scripted consumer (as in ``test_webhook.py``); the last test runs it on Apache Kafka with a real
job and two published plans.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from fairstream.streams.codec.refit_requests import RefitRequest
from fairstream.streams.config import adult_config
from fairstream.streams.refit.service import RefitService, trigger_of
from tests.streams.refit.test_webhook import ScriptedConsumer, actions, answer

AGENT = "fairstream-adult.monitor@host-3:4242"  # how the monitoring agent signs its requests (agent/service.py)


class VersionedJob:
    """Stands in for a :class:`RefitJob` of plans: serves ``serving`` (None: nothing), counts its runs and reads."""

    kind = "plan"
    config = adult_config()

    def __init__(self, serving: int | None):
        self.serving, self.runs, self.reads = serving, 0, 0

    def current(self):
        self.reads += 1
        if isinstance(self.serving, Exception):
            raise self.serving
        return None if self.serving is None else SimpleNamespace(version=self.serving)

    def run_once(self, source, trigger=None):
        self.runs += 1
        return SimpleNamespace(reason=f"re-fit {self.runs}")


def service_serving(serving, **options) -> tuple[RefitService, ScriptedConsumer, VersionedJob]:
    job, consumer = VersionedJob(serving), ScriptedConsumer()
    refit = RefitService(job, source=None, **{"min_interval_seconds": 0, **options})
    refit._consumer = consumer  # what _open() would have connected
    return refit, consumer, job


def agent_request(version: int | None) -> RefitRequest:
    return RefitRequest.new(f"drift of dependence_e under plan version {version}", statistic="dependence_e",
                            value=0.2, source=AGENT, version=version)


def test_a_request_about_the_serving_version_is_taken():
    refit, consumer, job = service_serving(4)
    request = agent_request(4)

    answer(refit, consumer, request)

    assert job.runs == 1 and actions(refit, request)[0][0] == "queued"


def test_a_request_about_a_replaced_version_is_dropped_with_one_warning(caplog):
    refit, consumer, job = service_serving(4)
    request = agent_request(3)

    with caplog.at_level(logging.INFO, logger="fairstream.streams.refit.service"):
        answer(refit, consumer, request)

    assert job.runs == 0
    ((action, reason),) = actions(refit, request)
    assert action == "superseded" and reason.startswith(
        "about plan version 3, but plan version 4 serves now (a newer version was promoted since)")
    lines = [r for r in caplog.records if request.request_id in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert all(part in lines[0].getMessage() for part in (request.request_id, "plan version 3", "plan version 4"))
    assert consumer.commits >= 1  # answered: the offset moves on


def test_a_request_about_a_version_rolled_back_is_dropped_too():
    refit, consumer, job = service_serving(2)
    request = agent_request(3)
    answer(refit, consumer, request)
    assert job.runs == 0 and "(it was rolled back since)" in actions(refit, request)[0][1]


def test_requests_without_a_version_are_answered_as_before_and_never_read_the_control_topic():
    refit, consumer, job = service_serving(4)
    by_hand, old_monitor = RefitRequest.new("asked by hand", source="operator"), agent_request(None)
    answer(refit, consumer, by_hand, old_monitor)
    assert job.runs == 2 and job.reads == 0


def test_when_what_serves_cannot_be_read_the_request_is_taken(caplog):
    refit, consumer, job = service_serving(ConnectionError("broker down"))
    request = agent_request(3)
    with caplog.at_level(logging.WARNING, logger="fairstream.streams.refit.service"):
        answer(refit, consumer, request)
    assert job.runs == 1 and "could not read which plan version serves (ConnectionError: broker down)" in caplog.text


def test_nothing_serving_takes_the_request():
    refit, consumer, job = service_serving(None)
    answer(refit, consumer, agent_request(1))
    assert job.runs == 1


def test_a_request_that_waited_out_the_rate_limit_while_a_newer_version_was_promoted_is_dropped():
    refit, consumer, job = service_serving(4, min_interval_seconds=3600)
    first = agent_request(4)
    answer(refit, consumer, first)
    assert job.runs == 1
    waiting = agent_request(4)
    consumer.send(waiting)
    refit.process_pending(timeout=0.3, idle_seconds=0)  # rate-limited: it waits (never idle, so the timeout ends it)
    assert [a for a, _ in actions(refit, waiting)] == ["queued"]

    job.serving = 5  # promoted meanwhile
    refit._last_refit_end -= 3600  # the interval has passed
    refit.process_pending(timeout=5, idle_seconds=0)

    assert job.runs == 1 and [a for a, _ in actions(refit, waiting)] == ["queued", "superseded"]
    assert refit._pending == []


def test_what_serves_is_read_once_per_poll_whatever_the_requests_in_it():
    refit, consumer, job = service_serving(4)
    for version in (3, 4, 4, 2):
        consumer.send(agent_request(version))
    refit.process_pending(timeout=5, idle_seconds=0)
    assert job.reads == 1 and job.runs == 1  # one read for the poll, the re-fit's check included
    assert sorted(d.action for d in refit.decisions if d.request_id) == ["coalesced", "queued", "superseded",
                                                                       "superseded"]


def test_the_agent_signs_its_requests_as_the_monitor_trigger():
    assert trigger_of(agent_request(1)) == "monitor"
    assert trigger_of(RefitRequest.new("x", source="alertmanager:Drift.monitor@prom:9093")) == "alertmanager"
    assert trigger_of(RefitRequest.new("x", source="research.monitoring")) == "other"
    refit, consumer, job = service_serving(1, triggers=("monitor",))
    answer(refit, consumer, agent_request(1))
    assert job.runs == 1


# --------------------------------------------------------------------------- on Apache Kafka, with a real job


@pytest.mark.integration
def test_on_kafka_a_request_about_a_replaced_plan_is_dropped_and_one_about_the_serving_plan_refits(broker, tmp_path):
    import dataclasses
    import uuid

    from fairstream.repair import datasets
    from fairstream.streams.refit.job import RefitJob
    from fairstream.streams.refit.requests import RequestPublisher
    from fairstream.streams.refit.sources import ResearchWindow
    from fairstream.streams.topics import ensure_topics

    config = adult_config(artifact_dir=str(tmp_path / "artifacts"))
    config = config.with_topics(prefix=f"versions-{uuid.uuid4().hex[:8]}")
    ensure_topics(broker.bootstrap, config.topics)
    first, rest = datasets.load("adult").split(3000, seed=1)
    second, _ = rest.split(3000, seed=2)
    X = second.X.copy()
    X[(second.s == 1) & (second.u == 1), 1] += 10  # one cell drifts: the plan fitted on it beats v1 there
    second = dataclasses.replace(second, X=X)
    job = RefitJob(config, broker.bootstrap)
    for data in (first, second):  # plan v1, then v2 replaces it
        outcome = job.run_once(ResearchWindow.of(data.X, data.s, data.u))
        assert outcome.published, outcome.reason
    assert job.current().version == 2
    stale, current = agent_request(1), agent_request(2)
    with RequestPublisher(broker.bootstrap, config.topics.refit_requests) as publish:
        publish(stale)
        publish(current)

    with RefitService(job, ResearchWindow.of(second.X, second.s, second.u), min_interval_seconds=0) as refit:
        outcomes = refit.process_pending(timeout=120)

    assert [a for a, _ in actions(refit, stale)] == ["superseded"]
    assert "about plan version 1, but plan version 2 serves now" in actions(refit, stale)[0][1]
    assert [a for a, _ in actions(refit, current)] == ["queued"] and len(outcomes) == 1


def test_on_a_signed_pipeline_only_a_requesters_signature_makes_a_request_count(tmp_path, caplog):
    """The webhook's token guards HTTP only: a request written straight to refit.requests must carry the signature of
    a key with the requester role (the agent's, the webhook's), or it is skipped with one warning."""
    import dataclasses

    from fairstream.streams.control.signing import Signer, generate_key, public_key_text, write_key_pair

    keys = tmp_path / "keys"
    for name in ("agent", "publisher"):
        write_key_pair(name, keys)
    trust = tmp_path / "trust.toml"
    trust.write_text("".join(f'[keys.{name}]\npublic_key = "{(keys / f"{name}.pub").read_text().strip()}"\n'
                             f'roles = ["{role}"]\n' for name, role in (("agent", "requester"), ("publisher", "publisher"))))
    job, consumer = VersionedJob(4), ScriptedConsumer()
    job.config = dataclasses.replace(adult_config(), trust=str(trust))
    refit = RefitService(job, source=None, min_interval_seconds=0)
    refit._consumer = consumer
    unsigned, wrong_role, forged, elsewhere, signed = (agent_request(4) for _ in range(5))
    agent, publisher = Signer.from_file(keys / "agent.key"), Signer.from_file(keys / "publisher.key")
    mallory = Signer("agent", generate_key())  # claims the agent's name with a key of its own
    assert public_key_text(mallory.key) != (keys / "agent.pub").read_text().strip()
    topic = job.config.topics.refit_requests
    for request, signer, pipeline in ((unsigned, None, topic), (wrong_role, publisher, topic), (forged, mallory, topic),
                                      (elsewhere, agent, "staging.refit.requests"), (signed, agent, topic)):
        value = request.to_json() if signer is None else signer.sign_json(request.to_json(), pipeline=pipeline)
        consumer.queue.append(SimpleNamespace(topic="refit.requests", partition=0, offset=len(consumer.queue),
                                              timestamp=len(consumer.queue), value=value))
    with caplog.at_level(logging.INFO, logger="fairstream.streams.refit.service"):
        refit.process_pending(timeout=5, idle_seconds=0)

    assert job.runs == 1 and actions(refit, signed)[0][0] == "queued"
    for request, why in ((unsigned, "the record is not signed"), (wrong_role, "a re-fit request needs the requester"),
                         (forged, "does not match"), (elsewhere, "not for fairstream.refit.requests")):
        ((action, reason),) = actions(refit, request)
        assert action == "unauthorised" and why in reason, reason
    warned = [r for r in caplog.records if "unauthorised" in r.getMessage()]
    assert len(warned) == 4 and all(r.levelno == logging.WARNING for r in warned)
