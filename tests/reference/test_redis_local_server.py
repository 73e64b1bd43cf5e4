"""LocalRedis (the test and bench server) survives a port taken between choosing it and binding it."""
from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Iterator

import pytest

from deferdump.reference.testing import redis_server
from deferdump.reference.testing.redis_server import LocalRedis, RedisServerError, free_port

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")


class _FakeRedis:
    """A listener on a port that answers every request with +PONG (someone else's server)."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen()
        self.port = self.socket.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(1024)
                    conn.sendall(b"+PONG\r\n")
                except OSError:
                    pass

    def close(self) -> None:
        self.socket.close()


@pytest.fixture
def taken() -> Iterator[_FakeRedis]:
    fake = _FakeRedis()
    yield fake
    fake.close()


def test_a_chosen_port_taken_meanwhile_moves_to_another(taken: _FakeRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    ports = iter([taken.port])
    monkeypatch.setattr(redis_server, "free_port", lambda: next(ports, None) or free_port())
    with LocalRedis() as server:
        assert server.port != taken.port  # the fake answered PONG on the first port: not ours, moved on
        assert server._server_pid() == server.process.pid
        assert server.cli("SET", "k", "v") == "OK" and server.cli("GET", "k") == "v"
        port = server.port
        server.restart()
        assert server.port == port  # a started server keeps its port across restarts


def test_a_given_port_that_is_taken_is_an_error_naming_it(taken: _FakeRedis) -> None:
    server = LocalRedis(port=taken.port)
    with pytest.raises(RedisServerError, match=f"port {taken.port} did not start"):
        server.start()
    assert not server.running
    server.close()


def test_a_port_another_listener_binds_fails_to_bind_and_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # bound and listening, never answering
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    try:
        ports = iter([blocker.getsockname()[1]])
        monkeypatch.setattr(redis_server, "free_port", lambda: next(ports, None) or free_port())
        with LocalRedis() as server:
            assert server.port != blocker.getsockname()[1] and server._server_pid() == server.process.pid
    finally:
        blocker.close()
