"""Harvester: CKAN portals into PostgreSQL + pgvector, driven by Airflow."""
