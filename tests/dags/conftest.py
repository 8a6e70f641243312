"""Fixtures of the DAG tests alone (the shared ones are in tests/conftest.py)."""
import pytest


@pytest.fixture
def catalogue():
    """A local DCAT catalogue server; tests give it the catalogue to serve."""
    from harvester.testing.dcat_portal import DcatServer

    with DcatServer() as server:
        yield server
