"""A real Prometheus server for the demo and the tests: start it on loopback, point it at workers, ask it things.

    from .prometheus import AGENT_JOB, ALERTS_YML, PrometheusServer, rules_with_short_for

    rules = rules_with_short_for(ALERTS_YML, tmp_path)          # alerts.yml, `for:` capped at 5s
    with PrometheusServer(tmp_path / "prom", ["127.0.0.1:9464"], [rules],  # workers: job fairstream-worker
                          jobs={AGENT_JOB: ["127.0.0.1:9470"]}) as prom:  # the pipeline's monitoring agent
        prom.wait_for_targets_up()
        prom.query('fairstream_fairness_dependence{stage="after"}')  # -> [{"metric": {...}, "value": [t, "0.01"]}]
        prom.wait_for_alert("FairstreamFairnessGapHigh", state="firing", timeout=60)

The server is ``/usr/bin/prometheus`` (the Debian ``prometheus`` package, installed by ``make
setup``) run as a subprocess with its own config, TSDB and log under ``run_dir``; it scrapes the
targets as job ``fairstream-worker`` (the job the alert rules select), and those of ``jobs`` under
their own job names (``{AGENT_JOB: [...]}``: the pipeline's monitoring agent, as production scrapes
it), every ``scrape_interval`` and evaluates the rule files every ``evaluation_interval``. Targets
are read from a file_sd file, so
:meth:`PrometheusServer.set_targets` can add or drop workers while it runs (e.g. a worker whose port
is only known after Prometheus started). Prometheus hands discovered targets to its scrapers at
most every 5s, so the first scrape of a target comes about 5s after start or ``set_targets``. Only
the standard library talks to it (urllib, JSON).

No orphans: the server leads its own process group, gets SIGTERM if the process that started it
dies (Linux parent-death signal), is stopped by ``stop()`` / the context manager (SIGTERM, then
SIGKILL), and by an ``atexit`` hook for servers someone forgot to stop.

Alert rules are the real ``deploy/prometheus/alerts.yml``. A test cannot wait the production
``for:`` durations (1m-5m), so :func:`rules_with_short_for` writes a copy in which *only* the
``for:`` values are capped (default 5s); expressions, thresholds, range windows, labels and
annotations are the production ones, and the copy is checked line by line to differ in nothing
else.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from fairstream.streams.parsing import parse_duration, parse_time

REPO = Path(__file__).resolve().parents[4]  # the checkout: deploy/ sits next to src/ (this is src/fairstream/streams/ops/)
DEPLOY = REPO / "deploy" / "prometheus"
ALERTS_YML = DEPLOY / "alerts.yml"
PROMETHEUS_YML = DEPLOY / "prometheus.yml"
ALERTS_TEST_YML = DEPLOY / "alerts_test.yml"
WORKER_JOB = "fairstream-worker"
AGENT_JOB = "fairstream-monitor"  # the monitoring agent's job (deploy/prometheus/prometheus.yml)
from .processes import (  # noqa: F401
    LOOPBACK,
    ManagedProcess,
    dies_with_owner,
    free_port,
    port_is_free,
    terminate_process_group,
)

_POLL_SECONDS = 0.2
T = TypeVar("T")


class PrometheusError(RuntimeError):
    """Prometheus could not be started, queried or waited for; the message carries its log tail."""


def binary(name: str) -> str:
    """Path of ``prometheus`` or ``promtool``: on PATH, else /usr/bin; a clear error if missing."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
    if found is None:
        raise PrometheusError(f"{name} not found: run `make setup` (installs the Debian package `prometheus`)")
    return found


# --------------------------------------------------------------------------- rule files for tests

_FOR_LINE = re.compile(r"^(?P<indent>\s*)for:\s*(?P<value>[0-9a-z]+)\s*(?P<comment>#.*)?$")


def rules_with_short_for(source: str | os.PathLike, dest_dir: str | os.PathLike, for_: str = "5s") -> Path:
    """Write a copy of the rule file ``source`` into ``dest_dir`` with every ``for:`` capped at ``for_``.

    This is the only change: a ``for:`` longer than ``for_`` becomes ``for_`` (shorter ones, such
    as ``for: 0m``, are kept), and every other line is byte-for-byte the original, which is checked
    before the copy is returned. A header comment at the top of the copy says so.
    """
    source, cap = Path(source), parse_duration(for_)
    original = source.read_text().splitlines(keepends=True)
    changed = []
    for line in original:
        match = _FOR_LINE.match(line.rstrip("\n"))
        if match and parse_duration(match["value"], positive=False) > cap:
            comment = f"  {match['comment']}" if match["comment"] else ""
            line = f"{match['indent']}for: {for_}  # test copy; {match['value']} in {source.name}{comment}\n"
        changed.append(line)
    if not any(_FOR_LINE.match(line.rstrip("\n")) for line in original):
        raise PrometheusError(f"{source} has no `for:` lines: is it a rule file?")
    for before, after in zip(original, changed, strict=True):
        if before != after and not (_FOR_LINE.match(before.rstrip("\n")) and _FOR_LINE.match(after.rstrip("\n"))):
            raise PrometheusError(f"rules_with_short_for changed a line that is not a `for:`: {before!r}")
    header = f"# TEST COPY of {source}: only the `for:` durations are capped at {for_}; nothing else differs.\n"
    dest = Path(dest_dir) / f"{source.stem}.for-{for_}{source.suffix}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(header + "".join(changed))
    return dest


# --------------------------------------------------------------------------- the server


class PrometheusServer(ManagedProcess):
    """A Prometheus subprocess on a free loopback port that scrapes ``targets`` as job ``fairstream-worker``.

    ``targets`` are ``host:port`` strings (the ``instance`` label of their series); ``jobs`` maps more
    job names to their targets (e.g. ``{AGENT_JOB: [agent]}``); ``rule_files``
    are loaded as they are (use :func:`rules_with_short_for` for short ``for:``). ``scrape_interval``
    also serves as the scrape timeout. Use it as a context manager, or call ``start()``/``stop()``.
    """

    error = PrometheusError

    def __init__(
        self,
        run_dir: str | os.PathLike,
        targets: Iterable[str],
        rule_files: Iterable[str | os.PathLike] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        job: str = WORKER_JOB,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        jobs: dict[str, Iterable[str]] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        super().__init__(self.run_dir / "prometheus.log")
        self.rule_files = [Path(path).resolve() for path in rule_files]
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.job = job
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._targets = list(targets)
        self._jobs = {name: list(found) for name, found in (jobs or {}).items()}
        if job in self._jobs:
            raise PrometheusError(f"job {job!r} is the main job: give its targets as `targets`")
        self._port: int | None = None
        for path in self.rule_files:
            if not path.is_file():
                raise PrometheusError(f"rule file {path} does not exist")

    # --- paths and addresses

    @property
    def config_path(self) -> Path:
        """The generated Prometheus configuration."""
        return self.run_dir / "prometheus.yml"

    @property
    def targets_path(self) -> Path:
        """The file-based service discovery file with the scraped targets."""
        return self.run_dir / "targets.json"

    def _targets_path(self, job: str) -> Path:
        return self.targets_path if job == self.job else self.run_dir / f"targets-{job}.json"

    @property
    def port(self) -> int:
        """The HTTP port (chosen at start)."""
        if self._port is None:
            raise PrometheusError("prometheus not started yet: no port chosen")
        return self._port

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://{LOOPBACK}:{self.port}"

    # --- lifecycle

    def start(self) -> "PrometheusServer":
        """Write the config, start Prometheus, and return once ``/-/ready`` answers 200."""
        if self.running:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.set_targets(self._targets)
        for name, found in self._jobs.items():
            self.set_targets(found, job=name)
        self.config_path.write_text(json.dumps(self._config(), indent=2) + "\n")  # JSON is YAML
        self.log_path.write_bytes(b"")
        for attempt in range(3):  # a free port can be lost to a race before Prometheus binds it
            self._port = free_port()
            if not port_is_free(LOOPBACK, self._port):
                continue
            self._spawn(f"prometheus on {LOOPBACK}:{self._port}")
            in_use = (lambda: attempt < 2 and "address already in use" in self.log_tail().lower())
            if self._wait_until(self._ready, "prometheus", retry_if=in_use):
                return self
        raise PrometheusError(f"prometheus found no free port after 3 attempts; log:\n{self.log_tail()}")

    def __repr__(self) -> str:
        state = f"pid={self.pid} at {self.url}" if self.running else "stopped"
        return f"<PrometheusServer {state} targets={self._targets}>"

    def set_targets(self, targets: Iterable[str], job: str | None = None) -> None:
        """Replace the scraped targets of ``job`` (None: the main one; another must be one of ``jobs``).
        Prometheus passes discovery changes to its scrapers at most every 5s, so a new target's first
        scrape comes about 5s later (also right after start)."""
        job = self.job if job is None else job
        if job == self.job:
            self._targets = found = list(targets)
        elif job in self._jobs:
            self._jobs[job] = found = list(targets)
        else:
            raise PrometheusError(f"no job {job!r}: the jobs are {[self.job, *self._jobs]}")
        path = self._targets_path(job)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": found, "labels": {}}]))
        os.replace(tmp, path)  # atomic: Prometheus never reads a half-written file

    def get(self, path: str, **params: Any) -> Any:
        """GET ``path`` of the API (e.g. ``/api/v1/query``) and return its ``data`` field."""
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:  # 4xx/5xx carry a JSON error for bad queries
            try:
                body = json.load(exc)
            except ValueError:
                raise PrometheusError(f"GET {url}: HTTP {exc.code}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"GET {url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """Evaluate an instant query now: ``[{"metric": {labels}, "value": [unix_time, "text"]}, ...]``."""
        data = self.get("/api/v1/query", query=expr)
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expr!r} is a {data['resultType']}, not an instant vector")
        return data["result"]

    def values(self, expr: str) -> dict[frozenset, float]:
        """The query's samples as {frozenset(label items): value}."""
        return {frozenset(item["metric"].items()): float(item["value"][1]) for item in self.query(expr)}

    def alerts(self, name: str | None = None) -> list[dict]:
        """Pending and firing alerts (``/api/v1/alerts``): dicts with labels, annotations, state, activeAt, value."""
        alerts = self.get("/api/v1/alerts")["alerts"]
        return [alert for alert in alerts if name is None or alert["labels"].get("alertname") == name]

    def rules(self) -> list[dict]:
        """Every loaded rule (``/api/v1/rules``), with its health, lastEvaluation and, for alerts, state."""
        return [rule for group in self.get("/api/v1/rules")["groups"] for rule in group["rules"]]

    def rule(self, name: str, labels: dict[str, str] | None = None) -> dict:
        """The loaded rule named ``name`` whose static labels include ``labels`` (raises unless exactly one).

        Several rules may share an alert name (one FairstreamFairnessGapHigh per statistic): their
        labels tell them apart.
        """
        matches = [rule for rule in self.rules()
                   if rule["name"] == name and (labels or {}).items() <= rule.get("labels", {}).items()]
        if len(matches) != 1:
            raise PrometheusError(f"{len(matches)} rules named {name!r} with labels {labels or {}} loaded "
                                  f"(rule files: {self.rule_files})")
        return matches[0]

    def targets(self, job: str | None = None) -> list[dict]:
        """The active targets of ``job`` (None: the main one; ``/api/v1/targets``): scrapeUrl, labels, health, ..."""
        active = self.get("/api/v1/targets", state="active")["activeTargets"]
        return [target for target in active if target["labels"].get("job") == (job or self.job)]

    def targets_up(self, job: str | None = None) -> list[str]:
        """The ``instance`` of every target of ``job`` (None: the main one) whose last scrape succeeded."""
        return sorted(target["labels"]["instance"] for target in self.targets(job) if target["health"] == "up")

    # --- waiting

    def wait_for(self, probe: Callable[[], T], timeout: float, what: str) -> T:
        """Call ``probe`` until it returns something truthy and return that; fail after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            if not self.running:
                raise PrometheusError(f"prometheus exited while waiting for {what}; log:\n{self.log_tail()}")
            last = probe()
            if last:
                return last
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} after {timeout:.0f}s (last: {last!r}); alerts now: {self._alert_summary()}")
            time.sleep(_POLL_SECONDS)

    def wait_for_targets_up(self, targets: Iterable[str] | None = None, timeout: float = 30.0,
                            job: str | None = None) -> list[str]:
        """Wait until every target in ``targets`` (default: all configured) of ``job`` (None: the main one) has been
        scraped successfully."""
        configured = self._targets if job in (None, self.job) else self._jobs[job]
        wanted = sorted(configured if targets is None else targets)
        self.wait_for(lambda: set(wanted) <= set(self.targets_up(job)), timeout, f"successful scrape of {wanted}")
        return wanted

    def wait_for_alert(self, name: str, state: str = "firing", timeout: float = 60.0,
                       labels: dict[str, str] | None = None) -> dict:
        """Wait until alert ``name`` (with ``labels``, if given) is in ``state`` (pending|firing); return it."""
        if state not in ("pending", "firing"):
            raise ValueError("state must be 'pending' or 'firing' (an inactive alert is not listed: see wait_for_evaluation)")

        def probe() -> dict | None:
            for alert in self.alerts(name):
                if alert["state"] == state and (labels or {}).items() <= alert["labels"].items():
                    return alert
            return None

        return self.wait_for(probe, timeout, f"{state} alert {name} {labels or ''}".rstrip())

    def wait_for_evaluation(self, name: str, after: float | None = None, timeout: float = 30.0,
                            labels: dict[str, str] | None = None) -> dict:
        """Wait until rule ``name`` has been evaluated after Unix time ``after`` (default: now); return the rule.

        The returned dict has ``state`` (inactive|pending|firing), ``health`` and ``alerts``: use it
        to assert that an alert is *not* active on data Prometheus has certainly seen.
        """
        after = time.time() if after is None else after

        def probe() -> dict | None:
            rule = self.rule(name, labels)
            evaluated = rule.get("lastEvaluation", "")
            return rule if evaluated and not evaluated.startswith("0001-") and parse_time(evaluated) > after else None

        return self.wait_for(probe, timeout, f"evaluation of rule {name} after {after:.3f}")

    # --- internals

    def _alert_summary(self) -> str:
        """The alerts Prometheus has now, as ``name(state)`` (for timeout messages); never raises."""
        try:
            return ", ".join(f"{a['labels'].get('alertname')}({a['state']})" for a in self.alerts()) or "none"
        except Exception as exc:  # the server may be the reason we timed out
            return f"unavailable ({type(exc).__name__})"

    def _config(self) -> dict:
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": [{
                "job_name": job,
                "file_sd_configs": [{"files": [str(self._targets_path(job).resolve())], "refresh_interval": "1s"}],
            } for job in (self.job, *self._jobs)],
        }

    def _command(self) -> list[str]:
        return [
            *dies_with_owner([binary("prometheus")]),
            f"--config.file={self.config_path.resolve()}",
            f"--storage.tsdb.path={(self.run_dir / 'data').resolve()}",
            f"--web.listen-address={LOOPBACK}:{self._port}",
        ]

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False
