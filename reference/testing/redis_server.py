"""Private `redis-server` processes on 127.0.0.1: one server, or a Redis Cluster of several masters.

The Redis store's tests, `deferdump bench` and the soak tests start real servers through this module: a
free port, no persistence (`--save ""`, no AOF), a scratch directory, and the server killed (SIGKILL, like a
crash) or stopped at the end. A killed server can be restarted on the same port, empty, as a restarted
server without persistence is.
"""
from __future__ import annotations

import contextlib
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from deferdump.reference.errors import UserError

START_TIMEOUT_S = 10.0


class RedisServerError(UserError):
    """redis-server is not installed, or did not start / form a cluster."""


class _PortTaken(RedisServerError):
    """Private to `LocalRedis.start`: another process holds the port (caught there, never escapes)."""


PORT_ATTEMPTS = 5


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_cluster_port() -> int:
    """A port P with P and its cluster bus port P + 10000 both free (kernel-picked ports may exceed 55535)."""
    for _ in range(200):
        port = random.randint(20000, 30000)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as a, socket.socket(socket.AF_INET, socket.SOCK_STREAM) as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RedisServerError("no free port pair (P, P + 10000) for a Redis Cluster node in 20000-30000")


def redis_binaries() -> tuple[str, str]:
    """Paths of redis-server and redis-cli; `RedisServerError` naming the package when missing."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        raise RedisServerError("redis-server/redis-cli not found: install Redis (Debian: apt-get install -y redis-server)")
    return server, cli


class LocalRedis:
    """One redis-server on 127.0.0.1:`port` (a free one by default), started by `start()`."""

    def __init__(
        self,
        port: int | None = None,
        *,
        maxmemory: str | None = None,
        policy: str = "allkeys-lru",
        extra_args: Sequence[str] = (),
        workdir: Path | None = None,
    ) -> None:
        self.server_bin, self.cli_bin = redis_binaries()
        self.port = port or free_port()
        self._may_move = port is None  # a port we chose may be taken before the server binds it: choose again
        self.maxmemory = maxmemory
        self.policy = policy
        self.extra_args = tuple(extra_args)
        self._own_dir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"deferdump-redis-{self.port}-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        args = [self.server_bin, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.workdir), "--protected-mode", "no", "--loglevel", "warning",
                "--logfile", str(self.workdir / "redis.log")]
        if self.maxmemory is not None:
            args += ["--maxmemory", self.maxmemory, "--maxmemory-policy", self.policy]
        return args + list(self.extra_args)

    def start(self) -> "LocalRedis":
        """Start the server and wait until it answers. A port this object chose itself (no ``port`` given)
        can be taken by another process between choosing and binding (parallel test workers, other suites):
        then it chooses another, up to PORT_ATTEMPTS times; once started, restarts keep the port."""
        if self.running:
            return self
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start_once()
            except _PortTaken as taken:
                if not self._may_move or attempt == PORT_ATTEMPTS:
                    raise RedisServerError(f"redis-server on port {self.port} did not start: {taken}") from None
                self.port = free_port()
                continue
            self._may_move = False
            return self
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_once(self) -> None:
        self.process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.ping():
            if self.process.poll() is not None or time.monotonic() > deadline:
                error = self.process.stderr.read().decode(errors="replace") if self.process.poll() is not None and self.process.stderr else ""
                self.kill()
                log = (self.workdir / "redis.log")
                detail = (error or (log.read_text(errors="replace") if log.exists() else "")).strip()[-500:]
                if "Address already in use" in detail:
                    raise _PortTaken(detail)
                raise RedisServerError(f"redis-server on port {self.port} did not start: {detail or 'no output'}")
            time.sleep(0.02)
        if self._server_pid() != self.process.pid:  # a PONG from another process's server on this port
            self.kill()
            raise _PortTaken("another process's server answers on this port")

    def _server_pid(self) -> int | None:
        """The process id the server on our port reports (INFO server), or None if it does not say."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as conn:
                conn.sendall(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
                reply = b""
                while b"process_id:" not in reply or not reply.split(b"process_id:", 1)[1].count(b"\r\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    reply += chunk
        except OSError:
            return None
        for line in reply.decode(errors="replace").splitlines():
            if line.startswith("process_id:"):
                return int(line.split(":", 1)[1])
        return None

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                conn.sendall(b"*1\r\n$4\r\nPING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def cli(self, *args: str) -> str:
        """Run `redis-cli -p PORT args...`; its output (raises on a non-zero exit)."""
        done = subprocess.run([self.cli_bin, "-p", str(self.port), *args], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RedisServerError(f"redis-cli {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout.strip()

    def kill(self) -> None:
        """SIGKILL (a crash: nothing flushed, connections reset) and reap."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        if self.process.stderr:
            self.process.stderr.close()
        self.process = None

    def restart(self) -> "LocalRedis":
        """Kill if running, then start again on the same port (empty: no persistence)."""
        self.kill()
        return self.start()

    def close(self) -> None:
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "LocalRedis":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class LocalRedisCluster:
    """`masters` cluster-enabled redis-servers joined by `redis-cli --cluster create` (no replicas)."""

    def __init__(self, masters: int = 3) -> None:
        if masters < 3:
            raise ValueError(f"a Redis Cluster needs at least 3 masters, got {masters}")
        self.workdir = Path(tempfile.mkdtemp(prefix="deferdump-redis-cluster-"))
        self.nodes: list[LocalRedis] = []
        for index in range(masters):
            node_dir = self.workdir / f"node{index}"
            node_dir.mkdir()
            self.nodes.append(LocalRedis(free_cluster_port(), workdir=node_dir, extra_args=(
                "--cluster-enabled", "yes", "--cluster-config-file", str(node_dir / "nodes.conf"),
                "--cluster-node-timeout", "2000",
            )))

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> "LocalRedisCluster":
        try:
            for node in self.nodes:
                node.start()
            addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
            self.nodes[0].cli("--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes")
            deadline = time.monotonic() + START_TIMEOUT_S
            while not all("cluster_state:ok" in node.cli("cluster", "info") for node in self.nodes):
                if time.monotonic() > deadline:
                    raise RedisServerError("the local Redis Cluster did not reach cluster_state:ok")
                time.sleep(0.1)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for node in self.nodes:
            node.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "LocalRedisCluster":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@contextlib.contextmanager
def local_redis(**options: object) -> Iterator[LocalRedis]:
    """A started `LocalRedis`, closed on exit."""
    server = LocalRedis(**options)  # type: ignore[arg-type]
    with server:
        yield server
