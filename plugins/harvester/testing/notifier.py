"""A third-party-style Airflow notifier for tests, given to portals.yaml by import path
(``class: harvester.testing.notifier.RecordingNotifier``): it renders a templated message from the
context, as the Slack and SMTP providers' notifiers do, and POSTs it to a local receiver."""
from __future__ import annotations

import requests

from airflow.sdk import BaseNotifier


class RecordingNotifier(BaseNotifier):
    template_fields = ("message",)

    def __init__(self, url: str, message: str = "{{ harvester.outcome }}"):
        super().__init__()
        self.url = url
        self.message = message

    def notify(self, context) -> None:
        requests.post(self.url, timeout=5, json={
            "message": self.message,
            "dag_id": context["dag"].dag_id,
            "has_task_context": "ti" in context and "params" in context,
            "harvester": context["harvester"],
        }).raise_for_status()
