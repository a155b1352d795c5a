"""Shared parsing: broker addresses, durations (re-fit schedules and alert rules alike) and RFC 3339 times."""

import doctest
import re

import pytest

from fairstream.streams import parsing
from fairstream.streams.ops.prometheus import ALERTS_YML
from fairstream.streams.parsing import parse_broker_url, parse_duration, parse_time


def test_parse_broker_url_accepts_faust_and_bootstrap_forms():
    assert parse_broker_url("kafka://k1:9092").bootstrap == "k1:9092"
    both = parse_broker_url("kafka://k1:9092;kafka://k2:9093")
    assert both.bootstrap == "k1:9092,k2:9093"
    assert both.url == "kafka://k1:9092;kafka://k2:9093"
    assert parse_broker_url("k1:9092, k2:9093").hosts == (("k1", 9092), ("k2", 9093))


@pytest.mark.parametrize("bad", ["", "kafka://", "k1", "k1:port", "http://k1:9092"])
def test_parse_broker_url_rejects_malformed(bad):
    with pytest.raises(ValueError):
        parse_broker_url(bad)


def test_one_duration_parser_reads_every_for_of_the_alert_rules():
    durations = re.findall(r"^\s*for:\s*(\S+)", ALERTS_YML.read_text(), flags=re.MULTILINE)
    assert "0m" in durations and len(durations) > 3
    seconds = [parse_duration(text, positive=False) for text in durations]
    assert min(seconds) == 0 and all(s % 60 == 0 for s in seconds)  # the rules count in minutes
    assert parse_duration("1h30m") == parse_duration("90m") == 5400.0 and parse_duration("250ms") == 0.25


@pytest.mark.parametrize("bad", ["0s", "0m", "0"])
def test_a_zero_duration_is_refused_unless_asked_for(bad):
    with pytest.raises(ValueError, match="positive"):
        parse_duration(bad)
    assert parse_duration(bad, positive=False) == 0.0


@pytest.mark.parametrize("bad", ["", "5x", "-5m", "-1", "1h 30", "nan", "inf"])
def test_a_malformed_or_negative_duration_is_refused_in_both_modes(bad):
    for positive in (True, False):
        with pytest.raises(ValueError):
            parse_duration(bad, positive=positive)


def test_rfc3339_times_with_zones_and_nanoseconds():
    assert parse_time("2026-01-02T03:04:05Z") == 1767323045.0
    assert parse_time("2026-01-02T04:04:05+01:00") == 1767323045.0
    assert parse_time("2026-01-02T03:04:05.123456789Z") == pytest.approx(1767323045.123456789, abs=1e-6)
    for bad in ("2026-01-02 03:04:05Z", "2026-01-02T03:04:05", "yesterday"):
        with pytest.raises(ValueError, match="RFC 3339"):
            parse_time(bad)


def test_the_examples_in_the_docstring_hold():
    assert doctest.testmod(parsing).failed == 0


def test_durations_in_the_units_a_schedule_is_written_in():
    assert parse_duration("90s") == 90.0
    assert parse_duration("5m") == 300.0
    assert parse_duration("1h") == 3600.0
    assert parse_duration("1h30m") == 5400.0
    assert parse_duration("2d") == 172800.0
    assert parse_duration("250ms") == 0.25
    assert parse_duration(" 45 ") == 45.0
    for bad in ("", "5x", "h", "1h 30", "-5m", "0s", "5m10", "nan", "inf"):
        with pytest.raises(ValueError):
            parse_duration(bad)
