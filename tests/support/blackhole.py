"""A TCP proxy on loopback that can turn into a black hole: `blackhole()` makes it stop
forwarding on every open connection, in both directions, without closing anything (no FIN, no
RST: the sockets stay open and the kernel keeps acknowledging), and connections accepted
meanwhile are held the same way, forever. That is what a client sees when a proxy, a load
balancer or a NAT in front of the API server loses its connections silently. `restore()` makes
new connections forward again; the ones it swallowed stay dead, as they would in such a box.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from dataclasses import dataclass, field


@dataclass
class _Pair:
    client: socket.socket
    upstream: socket.socket | None
    dead: bool = False
    threads: list[threading.Thread] = field(default_factory=list)


class BlackholeProxy:
    """`with BlackholeProxy(port) as proxy:` forwards 127.0.0.1:proxy.port to 127.0.0.1:port."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._holing = False
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="blackhole", daemon=True)

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> BlackholeProxy:
        self._thread.start()
        return self

    def __enter__(self) -> BlackholeProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def blackhole(self) -> int:
        """Stop forwarding, silently, on every connection now open and every new one.
        Returns how many open connections it swallowed."""
        with self._lock:
            self._holing = True
            alive = [p for p in self._pairs if not p.dead]
            for pair in alive:
                pair.dead = True
            return len(alive)

    def restore(self) -> None:
        """New connections are forwarded again."""
        with self._lock:
            self._holing = False

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            for sock in (pair.client, pair.upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()
        for pair in pairs:
            for thread in pair.threads:
                thread.join(timeout=2)
        self._thread.join(timeout=2)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                readable, _, _ = select.select([self._listener], [], [], 0.1)
                if not readable:
                    continue
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                holing = self._holing
            upstream = None
            if not holing:
                try:
                    upstream = socket.create_connection(("127.0.0.1", self.upstream_port), 5)
                except OSError:
                    client.close()
                    continue
            pair = _Pair(client, upstream, dead=holing)
            with self._lock:
                self._pairs.append(pair)
            if upstream is None:
                continue  # held open, never forwarded
            for src, dst in ((client, upstream), (upstream, client)):
                thread = threading.Thread(
                    target=self._pump, args=(pair, src, dst), name="blackhole-pump", daemon=True
                )
                pair.threads.append(thread)
                thread.start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        """Copy src to dst until either end closes; once the pair is dead, read nothing more
        and close nothing (the peer sees silence)."""
        while not self._closed.is_set():
            if pair.dead:
                self._closed.wait(0.1)
                continue
            try:
                readable, _, _ = select.select([src], [], [], 0.1)
                if not readable or pair.dead:
                    continue
                data = src.recv(65536)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return
