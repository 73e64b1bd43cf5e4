"""Which threads a test started and left running: the leak check of the queue-fed worker tests."""
from __future__ import annotations

import threading
import time


def new_threads(before: set[threading.Thread], timeout: float = 5.0) -> set[threading.Thread]:
    """Threads started since `before` that are still alive after up to `timeout` s (a stopping thread gets
    that long to finish)."""
    deadline = time.monotonic() + timeout
    while True:
        left = {t for t in threading.enumerate() if t not in before and t.is_alive()}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)
