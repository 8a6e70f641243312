"""The Gemini and Ollama providers against local servers speaking the real wire protocols: the real
google-genai SDK and real HTTP on 127.0.0.1, no network, no database."""
from __future__ import annotations

import json
import logging
import pickle
import socket
import traceback

import numpy as np
import pytest
from harvester.testing.gemini import FakeGemini, pseudo_embedding
from harvester.testing.ollama import FakeOllama

from harvester.domain.dataset import MAX_TEXT_CHARS
from harvester.embeddings import PROVIDERS, get_provider
from harvester.embeddings.base import EmbeddingError, RateLimited, TerminalEmbeddingError
from harvester.embeddings.gemini import GeminiProvider
from harvester.embeddings.ollama import OllamaProvider

KEY = "AIza-valid-test-key-0000000000"
SECRET = "AIzaTEST-SECRET-123"  # a key the fake rejects: must never show up anywhere
ENDPOINT = "/v1/models/gemini-embedding-001:batchEmbedContents"  # what google-genai 3.x sends


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GEMINI_BASE_URL", "GEMINI_EMBEDDING_MODEL",
                 "GEMINI_EMBEDDING_DIMENSION", "GEMINI_TIMEOUT", "AIRFLOW_CONN_GEMINI_DEFAULT",
                 "GOOGLE_GENAI_API_VERSION", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GEMINI_BASE_URL",
                 "OLLAMA_URL", "OLLAMA_EMBEDDING_MODEL", "OLLAMA_EMBEDDING_DIMENSION", "OLLAMA_MAX_BATCH",
                 "OLLAMA_TIMEOUT", "HARVESTER_EMBEDDING_PROVIDER"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def server():
    with FakeGemini(valid_keys={KEY}, models={"gemini-embedding-001", "gemini-embedding-2"}) as fake:
        yield fake


@pytest.fixture
def fake(server):
    server.requests.clear()
    server.delay = 0.0
    yield server
    server._fail.clear()


@pytest.fixture
def gemini(fake):
    return GeminiProvider(api_key=KEY, base_url=fake.base_url, timeout=5)


def _unit(vectors, dimension):
    for vector in vectors:
        array = np.asarray(vector)
        assert array.shape == (dimension,)
        assert abs(np.linalg.norm(array) - 1.0) < 1e-5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- Gemini: requests --------------------------------------------------------------------------
def test_batches_of_at_most_100_one_request_each(gemini, fake):
    texts = [f"dataset {i}: air quality measurements" for i in range(250)]
    with pytest.raises(ValueError, match="at most 100"):
        gemini.embed_documents(texts)
    assert fake.requests == []

    vectors = []
    for start in range(0, len(texts), gemini.max_batch):
        vectors += gemini.embed_documents(texts[start:start + gemini.max_batch])
    assert len(fake.requests) == 3
    assert [len(body["requests"]) for _, _, body in fake.requests] == [100, 100, 50]
    assert fake.texts == texts
    assert len(vectors) == 250
    _unit(vectors, 768)

    path, headers, body = fake.requests[0]
    assert path == ENDPOINT
    assert headers["x-goog-api-key"] == KEY
    assert body["requests"][0] == {"content": {"parts": [{"text": texts[0]}], "role": "user"},
                                   "taskType": "RETRIEVAL_DOCUMENT", "outputDimensionality": 768,
                                   "model": "models/gemini-embedding-001"}
    # what the API returned (cut to 768 values), normalized
    expected = np.asarray(pseudo_embedding(texts[0], "RETRIEVAL_DOCUMENT", 768))
    assert np.allclose(vectors[0], expected / np.linalg.norm(expected), atol=1e-6)
    assert gemini.model == "gemini-embedding-001@768" and gemini.dimension == 768 and gemini.name == "gemini"


@pytest.mark.parametrize("configured", [None, logging.INFO])
def test_requests_are_not_lines_of_the_task_log_unless_an_operator_asks(fake, caplog, configured):
    """The SDK's HTTP library logs every request at INFO: one line per 100 texts, 10,000 in a first
    sync of a million. Quieted, unless a level was configured for its logger."""
    loggers = [logging.getLogger(name) for name in ("httpx", "httpx2")]
    saved = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(configured or logging.NOTSET)
        caplog.set_level(logging.INFO)
        gemini = GeminiProvider(api_key=KEY, base_url=fake.base_url, timeout=5)
        for batch in range(2):
            assert len(gemini.embed_documents([f"text {batch} {i}" for i in range(100)])) == 100
        lines = [r.getMessage() for r in caplog.records if r.name in ("httpx", "httpx2")]
        if configured is None:
            assert lines == []
        else:
            assert len([line for line in lines if "batchEmbedContents" in line]) == 2, lines
    finally:
        for logger, level in zip(loggers, saved):
            logger.setLevel(level)


def test_the_sdk_neither_splits_nor_retries_and_the_api_refuses_101(fake):
    from google import genai
    from google.genai import errors, types

    client = genai.Client(api_key=KEY, vertexai=False, http_options=types.HttpOptions(base_url=fake.base_url))
    with pytest.raises(errors.ClientError) as info:
        client.models.embed_content(model="gemini-embedding-001", contents=["x"] * 101)
    assert info.value.code == 400 and "at most 100" in info.value.message
    assert len(fake.requests) == 1


def test_query_uses_retrieval_query(gemini, fake):
    query = gemini.embed_query("bicycle counts in Zürich")
    document = gemini.embed_documents(["bicycle counts in Zürich"])[0]
    assert [body["requests"][0]["taskType"] for _, _, body in fake.requests] == ["RETRIEVAL_QUERY",
                                                                                 "RETRIEVAL_DOCUMENT"]
    assert len(fake.requests[0][2]["requests"]) == 1
    _unit([query, document], 768)
    assert not np.allclose(query, document)


def test_one_vector_per_text_for_multimodal_models_too(fake):
    # google-genai merges bare strings into one Content for gemini-embedding-2: we send one Content each
    provider = GeminiProvider(api_key=KEY, model="gemini-embedding-2", base_url=fake.base_url)
    _unit(provider.embed_documents(["a", "b", "c"]), 768)
    assert [len(r["content"]["parts"]) for r in fake.requests[0][2]["requests"]] == [1, 1, 1]
    assert provider.model == "gemini-embedding-2@768"


def test_settings_from_the_environment(fake, monkeypatch):
    monkeypatch.setenv("HARVESTER_EMBEDDING_PROVIDER", "gemini")
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    monkeypatch.setenv("GEMINI_BASE_URL", fake.base_url)
    monkeypatch.setenv("GEMINI_EMBEDDING_DIMENSION", "256")
    provider = get_provider()
    assert isinstance(provider, GeminiProvider)
    assert (provider.model, provider.dimension, provider.max_batch) == ("gemini-embedding-001@256", 256, 100)
    vectors = provider.embed_documents(["a", "b"])
    _unit(vectors, 256)  # the API's 256 values are not unit length; ours are
    _, headers, body = fake.requests[0]
    assert headers["x-goog-api-key"] == KEY
    assert {r["outputDimensionality"] for r in body["requests"]} == {256}
    assert "gemini" in PROVIDERS and "ollama" in PROVIDERS


def test_key_from_the_airflow_connection_wins_over_the_env(fake, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", "AIza-env-key-should-lose")
    monkeypatch.setenv("AIRFLOW_CONN_GEMINI_DEFAULT", json.dumps({"conn_type": "generic", "password": KEY}))
    GeminiProvider(base_url=fake.base_url).embed_documents(["x"])
    assert fake.requests[-1][1]["x-goog-api-key"] == KEY


def test_no_key_is_terminal_and_says_how_to_set_it(fake):
    provider = GeminiProvider(base_url=fake.base_url)  # no connection, no GEMINI_API_KEY
    with pytest.raises(TerminalEmbeddingError) as info:
        provider.embed_documents(["x"])
    assert "GEMINI_API_KEY" in str(info.value) and "gemini_default" in str(info.value)
    assert fake.requests == []


def test_long_and_empty_texts_are_capped_deterministically(gemini, fake):
    gemini.embed_documents(["é" * (MAX_TEXT_CHARS + 5000), ""])
    sent = fake.texts
    assert sent == ["é" * MAX_TEXT_CHARS, " "]


# -- Gemini: errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("retry_after, retry_delay, expected", [(3, None, 3.0), (None, "7s", 7.0),
                                                                (None, "1.5s", 1.5), (None, None, None)])
def test_429_is_rate_limited(gemini, fake, retry_after, retry_delay, expected):
    fake.fail_next(1, 429, retry_after=retry_after, retry_delay=retry_delay)
    with pytest.raises(RateLimited) as info:
        gemini.embed_documents(["x"])
    error = info.value
    assert error.retry_after == expected and error.transient and not isinstance(error, TerminalEmbeddingError)
    assert "HTTP 429 RESOURCE_EXHAUSTED" in str(error)
    assert len(fake.requests) == 1  # the SDK did not retry
    assert pickle.loads(pickle.dumps(error)).retry_after == expected
    assert len(gemini.embed_documents(["x"])) == 1  # and the next call goes through


@pytest.mark.parametrize("status", [500, 503])
def test_server_errors_are_transient(gemini, fake, status):
    fake.fail_next(1, status)
    with pytest.raises(EmbeddingError) as info:
        gemini.embed_documents(["x"])
    assert type(info.value) is EmbeddingError and info.value.transient
    assert f"HTTP {status}" in str(info.value)
    assert len(fake.requests) == 1


@pytest.mark.parametrize("answer, says, terminal", [
    ("<html><body>502 Bad Gateway</body></html>", "not a JSON object", False),  # a proxy's page
    ({"embeddings": [{"values": ["x"] * 768}]}, "values that are not numbers", False),
    ({"error": "?"}, "returned no embeddings for 1 texts", False),
])
def test_an_answer_of_the_wrong_shape_is_an_error_that_says_so(gemini, fake, answer, says, terminal):
    fake.answer_next(answer)
    with pytest.raises(EmbeddingError, match=says) as raised:
        gemini.embed_documents(["one text"])
    assert isinstance(raised.value, TerminalEmbeddingError) is terminal
    assert len(gemini.embed_documents(["one text"])[0]) == 768  # the next answer is read as usual


@pytest.mark.parametrize("answer, shapes", [
    ({"embeddings": [{"values": [0.5] * 767}, {"values": [0.5] * 768}]}, [(767,), (768,)]),
    ({"embeddings": [{"values": []}, {"values": [0.5] * 768}]}, [(0,), (768,)]),
    ({"embeddings": [{"values": [0.5] * 768}]}, [(768,)]),  # one vector for two texts
    ({"embeddings": []}, []),
])
def test_vectors_of_the_wrong_size_or_count_are_returned_as_they_came_for_the_embed_step_to_judge(
        gemini, fake, answer, shapes):
    """The embed step (embeddings/batching.py) refuses such texts alone (issue 36): the provider does
    not fail the whole batch, nor the task, for them."""
    fake.answer_next(answer)
    assert [v.shape for v in gemini.embed_documents(["one text", "two texts"])] == shapes


def test_nan_in_googles_json_comes_back_as_nan_and_a_query_refuses_it(gemini, fake):
    fake.answer_next({"embeddings": [{"values": ["NaN"] + [0.5] * 767}, {"values": [0.5] * 767 + ["Infinity"]}]})
    first, second = gemini.embed_documents(["one text", "two texts"])
    assert np.isnan(first).any() and not np.isfinite(second).all()
    for answer, says, terminal in [
            ({"embeddings": [{"values": ["NaN"] * 768}]}, "not finite, or all zeros, for the query", False),
            ({"embeddings": [{"values": [0.5] * 767}]}, "a vector of 767 dimensions, expected 768", True),
            ({"embeddings": []}, "returned 0 embeddings for 1 texts", False)]:
        fake.answer_next(answer)
        with pytest.raises(EmbeddingError, match=says) as raised:
            gemini.embed_query("a query")
        assert isinstance(raised.value, TerminalEmbeddingError) is terminal


def test_timeouts_and_unreachable_servers_are_transient(fake):
    fake.delay = 1.0
    with pytest.raises(EmbeddingError) as info:
        GeminiProvider(api_key=KEY, base_url=fake.base_url, timeout=0.2).embed_documents(["x"])
    assert type(info.value) is EmbeddingError and "did not answer within 0.2s" in str(info.value)

    closed = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(EmbeddingError) as info:
        GeminiProvider(api_key=KEY, base_url=closed, timeout=2).embed_documents(["x"])
    assert type(info.value) is EmbeddingError and "could not reach Gemini" in str(info.value)


def test_unknown_model_is_terminal(fake):
    with pytest.raises(TerminalEmbeddingError, match="GEMINI_EMBEDDING_MODEL"):
        GeminiProvider(api_key=KEY, model="text-embedding-999", base_url=fake.base_url).embed_documents(["x"])


def _everything_about(error: BaseException) -> str:
    seen, chain = [], error
    while chain is not None:
        seen += [str(chain), repr(chain), repr(chain.args), repr(vars(chain))]
        chain = chain.__cause__ or chain.__context__
    return "\n".join(seen + traceback.format_exception(error))


def test_invalid_key_is_terminal_and_the_key_never_shows(fake, caplog):
    caplog.set_level(logging.DEBUG)
    provider = GeminiProvider(api_key=SECRET, base_url=fake.base_url)
    with pytest.raises(TerminalEmbeddingError) as info:
        provider.embed_documents(["x"])
    error = info.value
    assert fake.requests[-1][1]["x-goog-api-key"] == SECRET  # it was sent, in the header
    assert str(error).startswith("Gemini rejected the API key (HTTP 400 API_KEY_INVALID): check GEMINI_API_KEY "
                                 "or the gemini_default connection")
    assert error.__cause__ is None and error.__context__ is None
    assert SECRET not in _everything_about(error)
    assert SECRET not in repr(provider)
    assert SECRET not in caplog.text


def test_sdk_messages_are_scrubbed_of_the_key(fake):
    fake.valid_keys.add(SECRET)
    try:
        fake.fail_next(1, 500, message=f"backend choked on request with key {SECRET}")
        with pytest.raises(EmbeddingError) as info:
            GeminiProvider(api_key=SECRET, base_url=fake.base_url).embed_documents(["x"])
    finally:
        fake.valid_keys.discard(SECRET)
    assert "backend choked" in str(info.value)
    assert SECRET not in _everything_about(info.value)


# -- Ollama ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ollama_server():
    with FakeOllama(models={"nomic-embed-text": 768, "all-minilm": 384}) as fake:
        yield fake


@pytest.fixture
def ollama(ollama_server):
    ollama_server.requests.clear()
    yield ollama_server
    ollama_server._fail.clear()


def test_ollama_embeds_and_discovers_its_dimension(ollama, monkeypatch):
    monkeypatch.setenv("OLLAMA_URL", ollama.url)
    provider = get_provider("ollama")
    assert isinstance(provider, OllamaProvider)
    assert (provider.model, provider.max_batch) == ("ollama/nomic-embed-text", 64)
    assert ollama.requests == []  # nothing asked before the dimension is needed
    assert provider.dimension == 768
    assert len(ollama.requests) == 1  # one probe
    texts = ["rivers", "bus stops", "x" * (MAX_TEXT_CHARS + 10)]
    vectors = provider.embed_documents(texts)
    _unit(vectors, 768)
    path, _, body = ollama.requests[-1]
    assert path == "/api/embed"
    assert body["model"] == "nomic-embed-text" and body["input"] == texts[:2] + ["x" * MAX_TEXT_CHARS]
    _unit([provider.embed_query("rivers")], 768)
    assert np.allclose(provider.embed_query("rivers"), vectors[0])
    assert provider.dimension == 768 and len(ollama.requests) == 4  # no second probe
    with pytest.raises(ValueError):
        provider.embed_documents(["t"] * 65)


def test_ollama_dimension_from_the_environment(ollama, monkeypatch):
    monkeypatch.setenv("OLLAMA_EMBEDDING_MODEL", "all-minilm")
    monkeypatch.setenv("OLLAMA_EMBEDDING_DIMENSION", "384")
    monkeypatch.setenv("OLLAMA_MAX_BATCH", "8")
    provider = OllamaProvider(url=ollama.url)
    assert (provider.model, provider.dimension, provider.max_batch) == ("ollama/all-minilm", 384, 8)
    assert ollama.requests == []
    _unit(provider.embed_documents(["a"]), 384)

    wrong = OllamaProvider(url=ollama.url, model="all-minilm", dimension=768)
    with pytest.raises(TerminalEmbeddingError, match="returned 384 dimensions, expected 768"):
        wrong.embed_query("a")
    # A batch's vectors come as they are: the embed step judges them (a whole batch of one other
    # size fails the task there; tests/embeddings/test_unusable_vectors.py).
    assert [v.shape for v in wrong.embed_documents(["a", "b"])] == [(384,), (384,)]


def test_ollama_returns_a_batch_as_it_came_for_the_embed_step_to_judge(ollama):
    """Another count of vectors, a vector of another size, empty, all zeros: returned as they came,
    as the Gemini provider does (the embed step refuses those texts alone); a NaN, which Ollama
    answers with HTTP 500 "json: unsupported value: NaN", is an UnusableAnswer, not an outage."""
    from harvester.embeddings.base import UnusableAnswer

    provider = OllamaProvider(url=ollama.url, dimension=768)
    for text, how in (("short", "short"), ("empty", "empty"), ("zero", "zero"), ("missing", "missing")):
        ollama.poison(text, how)
    try:
        vectors = provider.embed_documents(["rivers", "short", "empty", "zero", "missing", "bus stops"])
        assert [v.shape for v in vectors] == [(768,), (767,), (0,), (768,), (768,)]
        _unit([vectors[0], vectors[4]], 768)
        assert not vectors[3].any()
        with pytest.raises(EmbeddingError, match="returned 0 embeddings for 1 texts"):
            provider.embed_query("missing")
        with pytest.raises(EmbeddingError, match="empty, not finite, or all zeros, for the query"):
            provider.embed_query("zero")

        ollama.poison("nan", "nan")
        with pytest.raises(UnusableAnswer) as info:
            provider.embed_documents(["rivers", "nan"])
        assert (info.value.reason, info.value.detail) == (
            "not-finite", "HTTP 500 (failed to encode response: json: unsupported value: NaN) for the 2 texts of its "
                          "batch, one of whose vectors is not finite")
        assert info.value.transient and info.value.__context__ is None
        ollama.fail_next(1, 500)  # any other 500: an outage, tried again
        with pytest.raises(EmbeddingError) as info:
            provider.embed_documents(["rivers"])
        assert type(info.value) is EmbeddingError and "trying again later may succeed" in str(info.value)
    finally:
        ollama.poisoned.clear()


def test_ollama_missing_model_says_pull_it(ollama):
    provider = OllamaProvider(url=ollama.url, model="mxbai-embed-large")
    with pytest.raises(TerminalEmbeddingError) as info:
        provider.dimension
    message = str(info.value)
    assert "ollama pull mxbai-embed-large" in message and 'model "mxbai-embed-large" not found' in message


def test_ollama_errors(ollama):
    provider = OllamaProvider(url=ollama.url, dimension=768)
    ollama.fail_next(1, 503)
    with pytest.raises(EmbeddingError) as info:
        provider.embed_documents(["a"])
    assert type(info.value) is EmbeddingError and "HTTP 503" in str(info.value)

    ollama.fail_next(1, 429, retry_after=2)
    with pytest.raises(RateLimited) as info:
        provider.embed_documents(["a"])
    assert info.value.retry_after == 2.0

    with pytest.raises(EmbeddingError) as info:
        OllamaProvider(url=f"http://127.0.0.1:{_free_port()}", dimension=768).embed_documents(["a"])
    assert type(info.value) is EmbeddingError and "could not reach Ollama" in str(info.value)
    assert info.value.__context__ is None


def test_unknown_provider_lists_the_valid_ones():
    with pytest.raises(TerminalEmbeddingError, match="local, gemini, ollama"):
        get_provider("openai")
