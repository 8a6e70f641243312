"""What tests, benches and the demo run against: local stand-ins of the outside services (a CKAN
portal, DCAT catalogues, the Gemini and Ollama APIs, a webhook receiver), the Airflow drivers
(``dag.test()`` and a real scheduler as subprocesses), the sample records and the demo.

Never imported by the runtime rooms (domain, config, sources, embeddings, store, pipeline): a
test walks the imports and fails if one does."""
