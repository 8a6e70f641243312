"""The one redactor (config/secrets.py) with every policy it took over: a user:password (or a lone
token) in the userinfo, secret-named query and fragment parameters, webhook paths, URLs whose
password broke the parse, and URLs inside a message; and the Airflow connection value forms."""
from __future__ import annotations

import pytest

from harvester.config.secrets import redact_connection, redact_text, redact_url, scrub_connection


@pytest.mark.parametrize("url, shown", [
    # userinfo: the password, the user with it, and a lone user (it may be a token)
    ("http://harvest:s3cret@127.0.0.1:5000", "http://***@127.0.0.1:5000"),
    ("https://user:secret@portal.example.org/data.json", "https://***@portal.example.org/data.json"),
    ("postgresql://h:pw@127.0.0.1:notaport/h", "postgresql://***@127.0.0.1:notaport/h"),
    ("postgresql://postgres@127.0.0.1:5432/harvester", "postgresql://***@127.0.0.1:5432/harvester"),
    ("https://ghp_Tok3n@git.example.org/x", "https://***@git.example.org/x"),
    ("https://a:p%40ss@[::1]:8443/x", "https://***@[::1]:8443/x"),
    # a password whose / broke the parse; no scheme at all
    ("https://harvest:Top/Secret9@x.org/data", "https://***@x.org/data"),
    ("harvest:TopSecret9@x.org/data", "***@x.org/data"),
    # secret-named query parameters, any case, - or _; others and empty ones kept
    ("https://x.org/api?key=K1&q=water", "https://x.org/api?key=***&q=water"),
    ("https://x.org/api?token=T1", "https://x.org/api?token=***"),
    ("https://x.org/api?api_key=K2&apikey=K3&apiKey=K4", "https://x.org/api?api_key=***&apikey=***&apiKey=***"),
    ("https://x.org/api?access_token=A1&page=2", "https://x.org/api?access_token=***&page=2"),
    ("https://x.org/f?signature=S1&X-Amz-Signature=S2&sig=S3", "https://x.org/f?signature=***&X-Amz-Signature=***&sig=***"),
    ("https://x.org/f?secret=S4&client_secret=S5", "https://x.org/f?secret=***&client_secret=***"),
    ("https://x.org/f?password=P1&pwd=P2", "https://x.org/f?password=***&pwd=***"),
    ("https://x.org/f?subscription-key=K5&token=", "https://x.org/f?subscription-key=***&token="),
    ("https://x.org/cb#access_token=A2&state=s", "https://x.org/cb#access_token=***&state=s"),
    # nothing secret: unchanged
    ("https://portal.example.org/data?x=a@b", "https://portal.example.org/data?x=a@b"),
    ("https://open.canada.ca/data/api/3/action/package_search?q=&rows=1000",
     "https://open.canada.ca/data/api/3/action/package_search?q=&rows=1000"),
    ("http://[::1", "http://[::1"),
])
def test_redact_url(url, shown):
    assert redact_url(url) == shown


@pytest.mark.parametrize("url, shown", [
    ("https://hooks.slack.com/services/T000/B000/XXXXSECRET", "https://hooks.slack.com/…"),
    ("https://user:pw@hooks.example.org:8443/hook?token=T", "https://hooks.example.org:8443/…"),
    ("http://127.0.0.1:9999/", "http://127.0.0.1:9999"),
    ("ftp://h.example/x", "ftp://h.example/…"),
    ("not a url", "<not a URL>"),
    ("http://[::1", "<unparseable URL>"),
])
def test_webhook_urls_show_only_their_origin(url, shown):
    assert redact_url(url, hide_path=True) == shown


def test_redact_text_redacts_every_url_in_a_message():
    text = ("HTTPConnectionPool(host='h', port=80): Max retries exceeded with url: /api?token=abc&x=1 "
            "(Caused by x) after http://u:p4ss@h:1/x?key=zz, and //a:b@c/d 'https://ok.example/p?q=1'")
    assert redact_text(text) == (
        "HTTPConnectionPool(host='h', port=80): Max retries exceeded with url: /api?token=***&x=1 "
        "(Caused by x) after http://***@h:1/x?key=***, and //***@c/d 'https://ok.example/p?q=1'")
    assert redact_text(redact_text(text)) == redact_text(text)


def test_connection_values_lose_their_password():
    assert redact_connection(" postgresql://harvester:pw@db:5432/h ") == "postgresql://***@db:5432/h"
    assert redact_connection('{"conn_type": "postgres", "password": "p\\"w", "host": "db"}') == \
        '{"conn_type": "postgres", "password": "***", "host": "db"}'
    raw = "postgresql://harvester:Pw-42@db:port/h"
    message = f"Port could not be cast to integer value in {raw}; password Pw-42"
    assert scrub_connection(message, raw) == \
        "Port could not be cast to integer value in postgresql://***@db:port/h; password ***"
