"""The worker app's own helpers (the app itself runs in test_worker_start and the pipeline tests)."""

from fairstream.streams.worker import app


def test_a_throttle_is_due_once_per_period_for_each_key():
    now = [100.0]
    throttle = app.Throttle(30.0, clock=lambda: now[0])
    assert throttle.due("plan") and throttle.due("scorer")  # the first time, for every key
    now[0] += 29.9
    assert not throttle.due("plan") and not throttle.due("scorer")
    now[0] += 0.1
    assert throttle.due("plan") and not throttle.due("plan")  # due again after the period, then it counts anew
    assert throttle.due("scorer")
