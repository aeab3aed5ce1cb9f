"""Child processes that do not outlive the process that started them.

``die_with_parent(sig)`` asks the Linux kernel to send ``sig`` to the calling process when its
parent exits (``prctl(PR_SET_PDEATHSIG)``, man 2 prctl), for the children ``observer run`` and
the addon start: the query API process (SIGTERM: uvicorn stops cleanly) and the observer worker
(SIGKILL: it must go even while stopped with SIGSTOP, which no other signal ends). Without it a
``kill -9`` of the proxy left the API serving its port under PID 1, and a stopped worker stopped
forever (trial findings).

The kernel sends the signal when the *thread* that started the child exits; both are started from
the main thread, which lives as long as the process. Elsewhere than Linux it does nothing (False).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int) -> bool:
    """Arms the parent-death signal ``sig`` for this process; True when the kernel accepted it.
    Never raises. Use in the child (``subprocess.Popen(preexec_fn=...)`` or first thing in its
    ``main``); a caller that must not run on if the parent is already gone checks ``os.getppid()``
    afterwards."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def death_signal_setter(sig: int) -> Callable[[], None]:
    """A function for ``subprocess.Popen(preexec_fn=...)`` that arms the parent-death signal
    ``sig`` in the child before it runs its program (the signal survives ``execve``, man 2
    prctl), so the child can never outlive the parent, not even when it is stopped before its
    own first statement. libc is looked up here, in the parent: between fork and exec the child
    only makes the one system call. A no-op elsewhere than Linux or without libc."""
    if not sys.platform.startswith("linux"):
        return _nothing
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return _nothing
    args = (PR_SET_PDEATHSIG, int(sig), 0, 0, 0)

    def arm() -> None:
        prctl(*args)

    return arm


def _nothing() -> None:
    return None


def parent_alive(expected_ppid: int) -> bool:
    """False when this process was re-parented (its parent ``expected_ppid`` exited before
    ``die_with_parent`` was armed)."""
    return os.getppid() == expected_ppid
