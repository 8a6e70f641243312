# The Airflow image of docker-compose.yaml: apache/airflow:3.3.2 + requirements.txt + this project.
#
#   docker compose build          (or: docker build -t harvester-airflow:latest .)
#
# The project is laid out under /opt/airflow (AIRFLOW_HOME) exactly as in the checkout
# (pyproject.toml, dags/, plugins/, sql/), and the package `harvester` is installed in editable
# mode from /opt/airflow/plugins. So paths the code derives from the checkout layout hold in
# the container too, and the read-only bind mounts of docker-compose.yaml (./dags, ./plugins,
# ./sql over the same paths) make local edits live without a rebuild; without those mounts the
# image runs on the code baked in here.
ARG AIRFLOW_BASE_IMAGE=apache/airflow:3.3.2
FROM ${AIRFLOW_BASE_IMAGE}

# Third-party requirements first, in their own layer, so code changes do not reinstall them.
# apache-airflow is pinned to the image's own version (AIRFLOW_VERSION is set by the base
# image) so that no requirement can upgrade or downgrade Airflow behind our back.
COPY --chown=airflow:0 requirements.txt requirements-local.txt /opt/airflow/
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /opt/airflow/requirements.txt
# The local embedding provider (ONNX Runtime, sentence-transformers, the models' weights). Build with
# --build-arg WITH_LOCAL_MODEL=false for an image that only calls a remote provider.
ARG WITH_LOCAL_MODEL=true
RUN if [ "$WITH_LOCAL_MODEL" = "true" ]; then \
        pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /opt/airflow/requirements-local.txt; \
    fi

# The project itself.
COPY --chown=airflow:0 pyproject.toml /opt/airflow/pyproject.toml
COPY --chown=airflow:0 plugins/ /opt/airflow/plugins/
COPY --chown=airflow:0 dags/ /opt/airflow/dags/
COPY --chown=airflow:0 sql/ /opt/airflow/sql/
# (pip leaves a copy of the package metadata in plugins/, on Airflow's sys.path: removed, or Airflow
# would find the plugin's airflow.plugins entry point twice.)
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -e /opt/airflow \
    && rm -rf /opt/airflow/plugins/harvester.egg-info \
    && python -c "import harvester"

# The local model's ONNX export, made once here rather than by the first task of every worker
# (docs/embeddings.md, "Local models"): workers find it checked in HARVESTER_MODEL_CACHE. (For
# multilingual-e5-small, add: HARVESTER_LOCAL_MODEL=multilingual-e5-small harvester embeddings local.)
ENV HARVESTER_MODEL_CACHE=/opt/airflow/models
RUN if [ "$WITH_LOCAL_MODEL" = "true" ]; then python -m harvester.cli.main embeddings local; fi
