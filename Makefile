# Harvester: `make demo` and `make test` work on a fresh machine (Python 3.11+, no services, no keys).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Where `make test` builds the docs site (git-ignored, like the rest of .harvester/).
DOCS_SITE := .harvester/site
# (mkdocs-material prints a banner about its successor on every build unless told not to)
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: install demo test test-fast test-deploy docs docs-build airflow db-start db-stop clean

install: $(STAMP)

$(STAMP): requirements.txt requirements-local.txt requirements-dev.txt requirements-celery.txt pyproject.toml
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

# The docs site first (mkdocs.yml, docs/): --strict fails on a broken link or anchor, a page missing
# from the nav, or a reference page docs/hooks.py cannot generate from the code. Not --quiet: it
# silences the warnings strict mode counts, so a broken link would pass; the INFO lines are dropped.
test: $(STAMP)
	set -o pipefail; $(MKDOCS) build --strict --site-dir $(DOCS_SITE) 2>&1 | { grep -v '^INFO ' || true; }
	$(BIN)/python -m pytest $(TEST_WORKERS_ARGS) $(PYTEST_ARGS)

# The suite in TEST_WORKERS processes (pytest-xdist), each with its own embedded PostgreSQL, Airflow
# home and model cache (tests/conftest.py makes them per process), a module's tests in one process
# (--dist loadscope: a module's shared catalogue is built once). Much of a test's time is spent
# waiting (on PostgreSQL, an HTTP server, a scheduler's subprocesses): on two cores two processes
# take the suite from 26 to about 16 minutes. TEST_WORKERS=0: one process, as a plain `pytest`.
TEST_WORKERS ?= 2
TEST_WORKERS_ARGS := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope)

# The fast part of the suite (no dag.test(), no real scheduler, no browser): under two minutes.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

# What `make test` runs on the embedded PostgreSQL 18, on another installation (issue 37: 15 to 18):
# the migrations from an empty database, and the DAG runs of a first sync, an incremental, a
# reconciliation, history, hybrid search and the search row; then tests/deploy/ (the compose stack, an upgrade),
# which a plain `pytest` does not collect. Needs that PostgreSQL with pgvector >= 0.8.0 and Debian's
# redis-server: .ci/postgres15 installs them for Debian 12's 15 (POSTGRES_BIN=/usr/lib/postgresql/17/bin
# for another).
POSTGRES_BIN ?= /usr/lib/postgresql/15/bin
DEPLOY_PG_TESTS := tests/store/test_migrations.py tests/dags/test_harvest_dag.py tests/dags/test_reconcile_dag.py \
	tests/dags/test_history_dag.py tests/store/test_history.py tests/store/test_hybrid_search.py \
	tests/store/test_portal_indexes.py tests/store/test_search_text_title.py tests/store/test_search_row.py \
	tests/store/test_keys_definition.py tests/store/test_duplicate_keys.py
test-deploy: $(STAMP)
	HARVESTER_TEST_POSTGRES_BIN=$(POSTGRES_BIN) $(BIN)/python -m pytest $(DEPLOY_PG_TESTS) $(PYTEST_ARGS)
	HARVESTER_TEST_POSTGRES_BIN=$(POSTGRES_BIN) HARVESTER_DEPLOY_TESTS=1 $(BIN)/python -m pytest tests/deploy $(PYTEST_ARGS)

# The docs site on http://127.0.0.1:8000, rebuilt on every edit (DOCS_ADDR=0.0.0.0:8000 to share it).
docs: $(STAMP)
	$(MKDOCS) serve --strict --dev-addr $(or $(DOCS_ADDR),127.0.0.1:8000)

# The docs site as static files in site/.
docs-build: $(STAMP)
	$(MKDOCS) build --strict --site-dir site

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
