"""Where a portal's notify: targets post in tests (a webhook URL, or harvester.testing.notifier's
RecordingNotifier): a local HTTP server that remembers every POST."""
from __future__ import annotations

from harvester.testing.local_http import LocalAPIServer


class Receiver(LocalAPIServer):
    """Remembers every POST in ``requests`` (path, headers, body) and answers 200, or the status
    ``statuses`` gives for the path."""

    name = "notify-receiver"

    def __init__(self):
        super().__init__()
        self.statuses: dict[str, int] = {}

    def _answer(self, path, headers, raw):
        self._record(path, headers, raw)
        status = self.statuses.get(path, 200)
        return status, {}, {"ok": status < 400}

    def bodies(self, path=None):
        return [body for p, _, body in self.requests if path is None or p == path]
