"""The Harvester page in the Airflow UI: an Airflow plugin (plugin.py) mounting a FastAPI app
(app.py: pages and a JSON API) at /harvester, with Airflow's own authentication (auth.py)."""
