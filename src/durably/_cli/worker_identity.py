"""The instance id of a `durably worker`: given, or a stable default for this host and app.

Why a stable default: the store ties a run's lease to the instance id of the process that
drives it. A worker restarted after SIGKILL or an OOM kill with the SAME id takes its previous
life's runs back as soon as the store proves that life gone; with a new id they wait out the
whole lease. So the default is `<hostname>:<APP>` (sanitised) — the same across restarts of
the same worker.

Why a slot number, and only when needed: the store refuses two live processes with one id
(the second would wait, then fail). Running the same app twice on one host is an ordinary
way to scale, so a second worker started while the first is alive gets `<hostname>:<APP>#2`
(the third `#3`, …) instead of an error: each number is held by a lock file that the kernel
releases when its process dies, and a starting worker takes the lowest free one. A restarted
worker therefore gets its old id back (the lowest number is free again once it is dead), and
a lone worker never carries a number at all.

The lock files live in the temporary directory (`TMPDIR`), named after the id. Two hosts with
one hostname, or one app started from two directories against one store, share a default id:
the store's own hold then keeps them apart (the second waits, then fails naming the id) —
give such workers `--instance-id` (or `DURABLY_INSTANCE_ID`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import socket
import tempfile
from dataclasses import dataclass

__all__ = ["MAX_SLOTS", "SlotHold", "claim_default_id", "default_base_id"]

MAX_SLOTS = 64

_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]+")


def default_base_id(app: str, hostname: str | None = None) -> str:
    """`<hostname>:<APP>` with every character outside `A-Za-z0-9._:-` replaced by `-`
    (so `#` stays free for the slot number)."""
    host = _UNSAFE.sub("-", (hostname or socket.gethostname()).replace(":", "-")) or "host"
    return f"{host}:{_UNSAFE.sub('-', app)}"


@dataclass
class SlotHold:
    """The lock file that keeps a default id for this process (released when it exits)."""

    instance_id: str
    fd: int

    def release(self) -> None:
        os.close(self.fd)  # closing the file drops its lock


def _lock(instance_id: str) -> int | None:
    digest = hashlib.sha1(instance_id.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"durably-worker-{digest}.lock")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        return None  # e.g. another user's file: treat the slot as taken
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def claim_default_id(app: str) -> SlotHold:
    """The lowest free default id of `app` on this host, held until the process exits."""
    base = default_base_id(app)
    for slot in range(1, MAX_SLOTS + 1):
        candidate = base if slot == 1 else f"{base}#{slot}"
        fd = _lock(candidate)
        if fd is not None:
            return SlotHold(candidate, fd)
    raise RuntimeError(
        f"{MAX_SLOTS} workers of {app} already run on this host (default ids {base} to "
        f"{base}#{MAX_SLOTS}): give this one --instance-id"
    )
