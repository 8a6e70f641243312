"""Fixtures of the UI API tests: Airflow's own app with the Harvester plugin, and real tokens."""
import pytest


@pytest.fixture(scope="module")
def client(world):
    """Airflow's API server app (the Harvester plugin mounted), over the module's ``world``."""
    from fastapi.testclient import TestClient

    from airflow.api_fastapi.app import create_app, purge_cached_app

    purge_cached_app()
    with TestClient(create_app()) as test_client:
        yield test_client
    purge_cached_app()


@pytest.fixture(scope="module")
def tokens(request, client):
    """Real tokens from Airflow's own login endpoint, for the module's PASSWORDS (user -> password)."""
    out = {}
    for user, password in request.module.PASSWORDS.items():
        response = client.post("/auth/token", json={"username": user, "password": password})
        assert response.status_code == 201, response.text
        out[user] = response.json()["access_token"]
    assert client.post("/auth/token", json={"username": "admin", "password": "wrong"}).status_code == 401
    return out
