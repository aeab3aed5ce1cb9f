"""Pipe sizes shared by the proxy's and the worker's ends (Linux ``F_SETPIPE_SZ``)."""

from __future__ import annotations

import fcntl

PIPE_BYTES = 1 << 20  # requested pipe capacity (Linux F_SETPIPE_SZ; the unprivileged maximum by default)
READ_BYTES = 1 << 20  # one read() from a pipe
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def set_pipe_size(fd: int) -> None:
    """Asks for a ``PIPE_BYTES`` pipe; keeps the default (64 KiB, which works) when refused."""
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:  # not Linux, or over /proc/sys/fs/pipe-max-size
        pass
