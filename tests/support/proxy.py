"""Loopback TCP proxies that misbehave on purpose: one cuts the first Server-Sent Events
stream after its first event (a client that follows a batch must reconnect and still see
the batch's end); one stands in front of PostgreSQL and is made slow or cut."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from types import TracebackType


def serve_each(listener: socket.socket, serve: Callable[[socket.socket], None]) -> None:
    """Accept connections until ``listener`` closes, each served by ``serve`` on a thread."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(client,), daemon=True).start()


class DroppingProxy:
    """Cuts the first events stream after its first event."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.event_streams = 0  # connections that asked for an events stream
        self.dropped = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=serve_each, args=(self.listener, self._serve), daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> DroppingProxy:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.listener.close()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        cut = threading.Event()  # this connection carries the stream to cut
        threading.Thread(target=self._requests, args=(client, upstream, cut), daemon=True).start()
        seen, sent = b"", 0  # of a stream to cut: what came, and what went on
        try:
            while chunk := upstream.recv(65536):
                if not cut.is_set():
                    client.sendall(chunk)
                    continue
                # Only up to the end of the first event goes on, even when the events
                # after it (the batch's end, for a quick batch) came in the same read.
                seen += chunk
                first = seen.find(b"event: progress")
                ends = [
                    found + len(blank)
                    for blank in (b"\r\n\r\n", b"\n\n")
                    if first >= 0 and (found := seen.find(blank, first)) >= 0
                ]
                end = min(ends, default=-1)
                limit = len(seen) if end < 0 else end
                client.sendall(seen[sent:limit])
                sent = limit
                if end >= 0:
                    break  # the first event is through: cut the stream mid-body
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _requests(
        self, client: socket.socket, upstream: socket.socket, cut: threading.Event
    ) -> None:
        """Client to upstream; a request for an events stream is counted, the first cut."""
        try:
            while chunk := client.recv(65536):
                if b"/events HTTP/1.1" in chunk:
                    with self._lock:
                        self.event_streams += 1
                        if self.dropped == 0:
                            self.dropped += 1
                            cut.set()
                upstream.sendall(chunk)
        except OSError:
            pass


class DatabaseProxy:
    """A loopback TCP proxy in front of PostgreSQL that a test can make slow or cut:

    * :meth:`hold` — new connections are accepted but get no answer until :meth:`release`
      (a database slow to come up);
    * :meth:`cut` — every open connection is closed and new ones are refused until
      :meth:`restore` (a restart, or no connection slot free).

    ``url`` is ``database_url`` with its port replaced by the proxy's.
    """

    def __init__(self, database_url: str) -> None:
        from sqlalchemy import make_url

        target = make_url(database_url)
        self.upstream = (target.host or "127.0.0.1", target.port or 5432)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = target.set(port=self.port).render_as_string(hide_password=False)
        self.connections = 0  # accepted so far
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._let_through = threading.Event()
        self._let_through.set()
        self._refusing = False

    def __enter__(self) -> DatabaseProxy:
        threading.Thread(target=serve_each, args=(self.listener, self._serve), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.listener.close()
        self.release()
        self.cut()

    def hold(self) -> None:
        self._let_through.clear()

    def release(self) -> None:
        self._let_through.set()

    def cut(self) -> None:
        with self._lock:
            self._refusing = True
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def restore(self) -> None:
        with self._lock:
            self._refusing = False

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            refusing = self._refusing
        if refusing:
            client.close()
            return
        self._let_through.wait()
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        with self._lock:
            if self._refusing:
                client.close()
                upstream.close()
                return
            self._open |= {client, upstream}
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
