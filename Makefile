# Harvester: `make demo` and `make test` work on a fresh machine (Python 3.11+, no services, no keys).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: install demo test airflow db-start db-stop clean

install: $(STAMP)

$(STAMP): requirements.txt requirements-local.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt -r requirements-local.txt -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@# pip leaves a copy of the package metadata in plugins/, which is on sys.path: Airflow would
	@# find the airflow.plugins entry point twice (the installed metadata is in the venv).
	rm -rf plugins/harvester.egg-info
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m harvester.testing.demo

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The Airflow UI on http://localhost:8080 with this project's DAGs (airflow standalone).
airflow: $(STAMP)
	$(BIN)/python -m harvester.testing.demo --standalone

db-start: $(STAMP)
	$(BIN)/harvester db start

db-stop: $(STAMP)
	$(BIN)/harvester db stop

clean:
	-$(BIN)/harvester db stop
	rm -rf .harvester
