"""`deferdump soak --store redis` against a real redis-server that is killed and restarted mid-run: the
failed dumps, loads and lookups are counted in `store_errors`, and still no invariant is violated,
nothing is pending or leaked, every request finishes and every delayed free happens."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import redis

from deferdump.reference.testing.redis_server import LocalRedis
from support.redis import redis_server  # noqa: F401 - fixture

DEFERDUMP = str(Path(sys.executable).parent / "deferdump")


def _sets(server: LocalRedis) -> int:
    try:
        stats = redis.Redis(port=server.port, socket_timeout=2).info("commandstats")
    except redis.RedisError:
        return 0
    return int(stats.get("cmdstat_set", {}).get("calls", 0))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _let_run(process: subprocess.Popen, cpu_s: float, limit_s: float = 600.0) -> None:
    """Wait until ``process`` used ``cpu_s`` more CPU seconds, or ended."""
    start = _cpu_seconds(process.pid)
    deadline = time.monotonic() + limit_s
    while process.poll() is None:
        try:
            if _cpu_seconds(process.pid) - start >= cpu_s:
                return
        except (FileNotFoundError, ProcessLookupError):
            return
        assert time.monotonic() < deadline, "the soak made no progress"
        time.sleep(0.05)


def test_soak_survives_a_redis_kill_and_restart(redis_server: LocalRedis) -> None:
    soak = subprocess.Popen(
        [DEFERDUMP, "soak", "--requests", "1200", "--faults", "0.005", "--store", "redis",
         "--redis-url", redis_server.url, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120
    while _sets(redis_server) < 200:  # mid-run: dumps are flowing
        assert soak.poll() is None, soak.stderr.read() if soak.stderr else ""
        assert time.monotonic() < deadline, "the soak never dumped to Redis"
        time.sleep(0.05)
    redis_server.kill()
    # steps keep running against a dead server, for 0.4 s of the soak's own CPU (~50 steps at ~7 ms), not of
    # wall time: a loaded machine could spend any wall time with no step run (no store error to count), and
    # the outage must end inside the cell it began in (a cell of 400 requests is ~270 steps): a cell that
    # opens its RedisStore while the server is down exits 2, as it should (1.5 s of its CPU crossed one here).
    _let_run(soak, cpu_s=0.4)
    redis_server.start()  # same port, empty
    out, err = soak.communicate(timeout=600)
    assert soak.returncode == 0, err[-3000:] + out[-3000:]
    report = json.loads(out)
    assert report["ok"] and report["violations"] == 0
    assert report["pending_tasks"] == 0 and report["live_event_handles"] == 0 and report["leaked_blocks"] == 0
    assert report["store_consistent"] and report["requests"] == 1200
    assert report["store_errors"] > 0  # the outage was seen and counted, not hidden
    for cell in report["cells"]:
        assert cell["held_requests"] == 0 and cell["tracked_left"] == 0 and cell["store_pending"] == 0
    assert _sets(redis_server) > 0  # dumps succeeded again on the restarted server, same soak process


def test_soak_redis_without_a_server_is_one_line_and_exit_2() -> None:
    done = subprocess.run([DEFERDUMP, "soak", "--requests", "30", "--store", "redis", "--redis-url",
                           "redis://127.0.0.1:1/0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "deferdump: Redis at redis://127.0.0.1:1/0 is not usable: ConnectionError: Error 111 connecting to "
        "127.0.0.1:1. Connection refused."
    ]
