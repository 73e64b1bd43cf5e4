"""Keep the connector's background threads out of OpenMP, so the forward's thread team keeps spinning.

A dump's copy (`index_select`, `copy_`) runs on a worker thread. Above its grain size ATen runs such an
op in an OpenMP parallel region, and a thread's first region creates a team of its own (another
`omp_get_max_threads() - 1` threads). GNU OpenMP (the runtime PyTorch's CPU wheels bundle) then manages more
threads than there are CPUs, and from that moment throttles the spin-wait of *every* team: the forward's
workers go to sleep between regions, and each matmul of the forward pays their wake-up. Measured in vLLM on
2 cores (tiny Llama, 8 requests decoding 128 tokens): 0.75-1.0 s with the copy threads' teams against
0.46-0.60 s without them and 0.48-0.61 s with no connector (docs/benchmarks.md, "Inside vLLM").

`omp_set_num_threads` sets the calling thread's own `nthreads-var`, and ATen opens its regions without a
`num_threads` clause (ParallelOpenMP.h), so a thread that sets 1 runs its regions alone and creates no team;
the forward's thread and `torch.get_num_threads()` are left as they were. A block copy gains nothing from a
second thread that the forward needs.
"""
from __future__ import annotations

import ctypes
import logging
import sys
from functools import cache

logger = logging.getLogger(__name__)

_RUNTIMES = ("libgomp", "libiomp", "libomp")  # GNU, Intel and LLVM OpenMP: each exports omp_set_num_threads


@cache
def _set_num_threads() -> "ctypes._NamedFuncPointer | None":
    """`omp_set_num_threads` of the OpenMP runtime already in this process, or None where none is loaded."""
    try:
        return ctypes.CDLL(None).omp_set_num_threads  # torch loads its runtime with RTLD_GLOBAL
    except (AttributeError, OSError):
        pass
    for path in _loaded_libraries():
        name = path.rsplit("/", 1)[-1]
        if name.startswith(_RUNTIMES):
            try:
                return ctypes.CDLL(path).omp_set_num_threads
            except (AttributeError, OSError):
                continue
    return None


def _loaded_libraries() -> list[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            return sorted({line.split()[-1] for line in maps if ".so" in line and "/" in line})
    except OSError:  # not Linux: no way to find a runtime that is not global
        return []


def serial_openmp_in_this_thread() -> bool:
    """Make OpenMP regions opened by the calling thread run on it alone; True when a runtime took it.

    Only where torch is already imported (an OpenMP runtime is then loaded, and only torch's ops open
    regions here); a process without torch keeps its runtime, if any, untouched."""
    if "torch" not in sys.modules:
        return False
    setter = _set_num_threads()
    if setter is None:
        logger.debug("no OpenMP runtime in this process: background threads left as they are")
        return False
    setter(1)
    return True
