"""When this process's TVM thread pool last ran parallel work, so that a kernel measured in
another process is not timed beside this pool's spinning threads.

After a parallel call TVM's pool threads busy-wait for a while (TVM_THREAD_POOL_SPIN_COUNT spins,
a few hundred milliseconds at most) before they sleep. A runner's worker timing a parallel kernel
on the same cores meanwhile loses its threads to them, and a parallel region whose thread is
descheduled waits out a whole scheduler slice: a microsecond kernel then times in milliseconds,
and the log keeps that. So code that runs TVM kernels here (a library timing, a verification
run) notes it, and the measuring code waits until the pool has gone quiet. The state is
process-wide because the pool is.
"""

from __future__ import annotations

import math
import time

SPIN_SECONDS = 0.3  # longer than the pool's threads spin after a call
_last_parallel_work = -math.inf


def note_parallel_work() -> None:
    """This process's TVM pool just ran (its threads now spin for a while)."""
    global _last_parallel_work
    _last_parallel_work = time.perf_counter()


def wait_for_idle_pool() -> float:
    """Sleep until SPIN_SECONDS have passed since the last noted parallel work; the seconds
    slept (0 when the pool has been idle long enough)."""
    left = _last_parallel_work + SPIN_SECONDS - time.perf_counter()
    if left <= 0:
        return 0.0
    time.sleep(left)
    return left
