"""The machinery of a stub whose protocol is lines over TCP (IRC, IMAP, SMTP), not HTTP.

- `LineServer`: a threaded server on 127.0.0.1 that hands each connection (`LineConn`) to its stub. The stub's URL
  is `tcp://127.0.0.1:PORT`: the proxy's reverse listener in front of it relays raw TCP (mitmproxy's
  `reverse:tcp://` mode), so each connection is a TCP flow whose messages the addon inspects; a client that speaks
  TLS to the listener has it terminated there with the project's CA. `LineStub` serves a stub's `session` on one.
- `StartTlsFront`: what a server-first protocol whose client turns TLS on with STARTTLS and verifies it (SMTP on
  its submission port) needs. The proxy's reverse listeners are lazy: they connect upstream only once the client
  has said something, and an SMTP client waits for the server's greeting; and a TLS handshake inside a raw TCP
  relay would leave the proxy only ciphertext. The front greets the client itself, relays each command and reply
  in clear through the tenant's proxy listener, answers the handshake after the server's `220` to STARTTLS with
  a leaf of the project's CA (`tls_context`), and then relays every byte decrypted: the proxy's TCP flow holds the
  whole dialogue in clear, the client's credentials and messages included.
"""

from __future__ import annotations

import contextlib
import ipaddress
import select
import socket
import socketserver
import ssl
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from harness.capture.proxy import CERTS, ensure_ca

MAX_LINE = 1 << 20  # a line longer than this is cut there (a client that never ends its line)


class LineConn:
    """One client connection: lines in (without their CRLF), bytes out; `peer` is the port it came from (the
    proxy's own, when it passed the proxy)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.peer: int = sock.getpeername()[1]
        self._buf = b""

    def readline(self, keep_end: bool = False) -> bytes | None:
        """The next line (None when the client closed or reset the connection)."""
        while b"\n" not in self._buf and len(self._buf) < MAX_LINE:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return None
            if not data:
                return None
            self._buf += data
        cut = self._buf.find(b"\n") + 1 or MAX_LINE
        line, self._buf = self._buf[:cut], self._buf[cut:]
        return line if keep_end else line.rstrip(b"\r\n")

    def ready(self, seconds: float) -> bool:
        """Whether the client sends something within `seconds` (a server-first protocol told from a client-first
        one on the same port)."""
        return bool(self._buf) or bool(select.select([self.sock], [], [], seconds)[0])

    def send(self, *lines: str) -> None:
        """Lines, each ended with CRLF."""
        self.sock.sendall("".join(f"{line}\r\n" for line in lines).encode("utf-8", "surrogateescape"))


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        conn = LineConn(self.request)
        self.server.opened(self.request)
        try:
            self.server.session(conn)
        except (OSError, ssl.SSLError):  # a client that hung up, a handshake it broke off
            pass
        finally:
            self.server.closed(self.request)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, session: Callable[[LineConn], None], sock: socket.socket | None) -> None:
        self.session = session
        self.open: set[socket.socket] = set()
        self.open_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler, bind_and_activate=sock is None)
        if sock is not None:
            self.socket.close()
            self.socket = sock
            self.server_address = sock.getsockname()

    def opened(self, sock: socket.socket) -> None:
        with self.open_lock:
            self.open.add(sock)

    def closed(self, sock: socket.socket) -> None:
        with self.open_lock:
            self.open.discard(sock)

    def close_all(self) -> None:
        """End every connection still open (a long-lived one's thread waits on it)."""
        with self.open_lock:
            for sock in self.open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class LineServer:
    """A threaded TCP server on 127.0.0.1 running `session` for each connection."""

    def __init__(self, session: Callable[[LineConn], None], name: str) -> None:
        self.session, self.name = session, name
        self._server: _Server | None = None

    def start(self, sock: socket.socket | None = None) -> Self:
        self._server = _Server(self.session, sock)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                         name=f"stub-{self.name}").start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return self._server.server_address[1]

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.close_all()
            self._server.server_close()
            self._server = None


class LineStub:
    """A stub (with the shape of `base.Service`) whose protocol is lines over TCP: it serves `session` on a
    `LineServer` of its own, at a `tcp://` URL. Mixed in before the stub's other bases."""

    _lines: LineServer | None = None
    service: str
    tenant: Any

    def session(self, conn: LineConn) -> None:
        """Serve one connection."""
        raise NotImplementedError

    def start(self, sock: socket.socket | None = None) -> Self:
        self._lines = LineServer(self.session, f"{self.service}-{self.tenant.name}").start(sock)
        return self

    @property
    def port(self) -> int:
        assert self._lines is not None, "stub not started"
        return self._lines.port

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._lines is not None:
            self._lines.stop()
            self._lines = None


def tls_context(host: str = "127.0.0.1", confdir: Path = CERTS) -> ssl.SSLContext:
    """A server context with a leaf for `host` (an IP address SAN) signed by the project's CA, which every Hermes
    child trusts: what a client that verifies its server accepts."""
    ensure_ca(confdir)
    from mitmproxy.certs import CertStore

    entry = CertStore.from_store(confdir, "mitmproxy", 2048).get_cert(
        host, [x509.IPAddress(ipaddress.ip_address(host))])
    key = entry.privatekey.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory(prefix="tenancy-leaf-") as folder:  # 0700: the key is the CA's own
        pem = Path(folder) / "leaf.pem"
        pem.touch(mode=0o600)
        pem.write_bytes(entry.cert.to_pem() + key)
        context.load_cert_chain(pem)
    return context


class StartTlsFront:
    """A STARTTLS front for a line protocol whose server greets first and answers STARTTLS with `220` (SMTP): see
    the module docstring. `target()` is where it relays to (the tenant's proxy listener, else its stub)."""

    def __init__(self, target: Callable[[], tuple[str, int]], greeting: str, name: str) -> None:
        self.target, self.greeting = target, greeting
        self._context: ssl.SSLContext | None = None
        self._lines = LineServer(self._relay, f"{name}-front")

    def start(self) -> Self:
        self._context = tls_context()
        self._lines.start()
        return self

    @property
    def port(self) -> int:
        return self._lines.port

    def stop(self) -> None:
        self._lines.stop()

    def _relay(self, conn: LineConn) -> None:
        conn.send(self.greeting)
        line = conn.readline(keep_end=True)
        if line is None:
            return
        with socket.create_connection(self.target(), timeout=60) as up:  # once the client spoke: the proxy is lazy
            server = LineConn(up)
            while line is not None:
                up.sendall(line)
                reply = _reply(server)
                if reply is None:
                    return
                conn.sock.sendall(reply)
                if line.strip().upper() == b"STARTTLS" and reply.startswith(b"220"):
                    assert self._context is not None
                    _pump(self._context.wrap_socket(conn.sock, server_side=True), up)
                    return
                line = conn.readline(keep_end=True)


def _reply(server: LineConn) -> bytes | None:
    """A server's whole reply: its lines up to the last (`250-...` goes on, `250 ...` ends it); an untagged line of
    another protocol's greeting (`* OK`, a stub that took the connection for IMAP before it spoke) is dropped."""
    out = b""
    while (line := server.readline(keep_end=True)) is not None:
        if line.startswith(b"* "):
            continue
        out += line
        if len(line) < 5 or line[3:4] != b"-":
            return out
    return None


def _pump(client: ssl.SSLSocket, up: socket.socket) -> None:
    """Relay both ways (the client's side decrypted) until either side closes."""
    with client:
        while True:
            readable = [client] if client.pending() else select.select([client, up], [], [], 300)[0]
            if not readable:
                return
            for sock in readable:
                data = sock.recv(65536)
                if not data:
                    return
                (up if sock is client else client).sendall(data)
