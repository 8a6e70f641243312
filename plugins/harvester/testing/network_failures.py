"""Network failures on loopback, real ones (test-only), for the wording of what went wrong
(harvester.http.guard.failure_text): a port nobody listens on (connection refused), a listener
whose queue is full (a connect that times out), a server that hangs up without answering, one
that never answers, and an HTTPS server whose certificate is self-signed (TLS)."""
from __future__ import annotations

import datetime
import socket
import ssl
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def refused_url(path: str = "/data.json") -> str:
    """A URL on 127.0.0.1 at a port nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"


@contextmanager
def full_queue(path: str = "/data.json") -> Iterator[str]:
    """A URL whose listener never accepts and whose queue is full: a connect to it times out."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        held = []
        try:
            for _ in range(8):  # (fill the queue: the first connects are queued)
                sock = socket.socket()
                sock.settimeout(0.2)
                try:
                    sock.connect(("127.0.0.1", port))
                except OSError:
                    sock.close()
                    break
                held.append(sock)
            yield f"http://127.0.0.1:{port}{path}"
        finally:
            for sock in held:
                sock.close()


class _Acceptor:
    """Accepts connections on 127.0.0.1 in a daemon thread; each goes to ``handle`` (its own
    thread), ``wrap`` (an SSLContext) first when given."""

    def __init__(self, handle, context: ssl.SSLContext | None = None, scheme: str = "http"):
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._handle, self._context, self._scheme = handle, context, scheme
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="network-failures", daemon=True)

    def url(self, path: str = "/data.json") -> str:
        return f"{self._scheme}://127.0.0.1:{self.port}{path}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            if self._context is not None:
                conn = self._context.wrap_socket(conn, server_side=True)
            self._handle(conn, self._stop)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def __enter__(self) -> "_Acceptor":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(2)


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        chunk = conn.recv(4096)
        if not chunk:
            return
        data += chunk


def hang_up() -> _Acceptor:
    """A server that reads the request and closes the connection without a word."""
    return _Acceptor(lambda conn, stop: _read_request(conn))


def _answer(conn: ssl.SSLSocket, stop) -> None:
    _read_request(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")


def self_signed_https() -> _Acceptor:
    """An HTTPS server (TLS) whose certificate nobody signed but itself, for "localhost"."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as folder:
        cert_file, key_file = Path(folder) / "cert.pem", Path(folder) / "key.pem"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        context.load_cert_chain(cert_file, key_file)
    return _Acceptor(_answer, context, scheme="https")


def plain_http_on_a_tls_url() -> _Acceptor:
    """A plain HTTP server asked for with https:// (the handshake fails)."""
    def answer(conn, stop):  # (at once: the client's ClientHello holds no end of headers to wait for)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    acceptor = _Acceptor(answer)
    acceptor._scheme = "https"
    return acceptor
