"""CPU seconds of processes and of a local PostgreSQL server's processes over a time window.

Used by ``workers.py``. Live processes are read from ``/proc/<pid>/stat`` (utime + stime). A
server backend that exits inside the window is gone from ``/proc`` by the end, and a pool that
opens and closes connections under load makes many of those; their CPU is read from the
kernel's exit records (taskstats over generic netlink, the interface ``getdelays`` uses: one
record per exiting task with its user and system time in microseconds). That needs
CAP_NET_ADMIN (root); without it the exited backends' CPU is reported as unknown, and the
server's total for exited children (the postmaster's ``cutime + cstime``) is given instead.

Stdlib plus psutil (to find the server and its children).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The command name may contain spaces and parentheses: split after the last ')'.
            return f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def cpu_s(pid: int) -> float | None:
    """utime + stime of a process (all its threads) in seconds; None if it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of proc(5)


def context_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of a process so far (0, 0 if it is gone).
    Voluntary ones are waits (an idle event loop blocking in epoll); involuntary ones are
    preemptions by other runnable processes."""
    counts = {"voluntary_ctxt_switches": 0, "nonvoluntary_ctxt_switches": 0}
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in counts:
                    counts[key] = int(value)
    return counts["voluntary_ctxt_switches"], counts["nonvoluntary_ctxt_switches"]


def reaped_children_cpu_s(pid: int) -> float:
    """cutime + cstime: the CPU of the children ``pid`` has waited for."""
    fields = _stat_fields(pid)
    return 0.0 if fields is None else (int(fields[13]) + int(fields[14])) / CLK_TCK


def find_postmaster(port: int) -> int | None:
    """The pid of the PostgreSQL server on this machine (a ``postgres`` process whose parent
    is not one, listening on ``port`` when there are several); None if none is visible."""
    import psutil  # type: ignore[import-untyped]

    found = []
    for proc in psutil.process_iter(["name", "ppid"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["name"] not in ("postgres", "postmaster"):
                continue
            ppid = proc.info["ppid"]
            if not ppid or psutil.Process(ppid).name() not in ("postgres", "postmaster"):
                found.append(proc)
    for proc in found:
        with contextlib.suppress(psutil.Error):
            if any(c.laddr.port == port for c in proc.net_connections("tcp")):
                return int(proc.pid)
    return int(found[0].pid) if len(found) == 1 else None


def children_cpu_s(ppid: int) -> dict[int, float]:
    """CPU seconds of every live child of ``ppid``."""
    import psutil

    out: dict[int, float] = {}
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(ppid).children():
            value = cpu_s(child.pid)
            if value is not None:
                out[child.pid] = value
    return out


# ------------------------------------------------------------------------ taskstats exits

_NETLINK_GENERIC = 16
_GENL_ID_CTRL = 16
_CTRL_CMD_GETFAMILY = 3
_CTRL_ATTR_FAMILY_ID = 1
_CTRL_ATTR_FAMILY_NAME = 2
_TASKSTATS_CMD_GET = 1
_CMD_ATTR_REGISTER_CPUMASK = 3
_CMD_ATTR_DEREGISTER_CPUMASK = 4
_TYPE_PID = 1
_TYPE_STATS = 3
_TYPE_AGGR_PID = 4
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
# Offsets in struct taskstats (linux/taskstats.h, unchanged since version 1 of the struct).
_OFF_PPID = 132
_OFF_UTIME = 152  # ac_utime, ac_stime: microseconds


def _attr(kind: int, data: bytes) -> bytes:
    size = 4 + len(data)
    return struct.pack("HH", size, kind) + data + b"\0" * (-size % 4)


def _attrs(buf: bytes) -> Iterator[tuple[int, bytes]]:
    off = 0
    while off + 4 <= len(buf):
        size, kind = struct.unpack_from("HH", buf, off)
        if size < 4:
            return
        yield kind & 0x3FFF, buf[off + 4 : off + size]
        off += (size + 3) & ~3


class ExitListener:
    """Records the CPU seconds of every exiting child of ``ppid`` between ``begin`` and
    ``end``, from the kernel's taskstats exit records (a netlink listener; root only)."""

    def __init__(self, ppid: int) -> None:
        self.ppid = ppid
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_GENERIC)
        with contextlib.suppress(OSError):  # SO_RCVBUFFORCE: past rmem_max (root)
            self._sock.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)
        self._sock.bind((0, 0))
        self._mask = f"0-{(os.cpu_count() or 1) - 1}\0".encode()
        self._family = self._resolve_family()
        self._request(_CMD_ATTR_REGISTER_CPUMASK)
        self.exits: dict[int, float] = {}
        self.overflowed = False
        self._recording = False
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _send(self, family: int, cmd: int, payload: bytes) -> None:
        body = struct.pack("BBH", cmd, 1, 0) + payload
        self._sock.send(struct.pack("IHHII", 16 + len(body), family, _NLM_F_REQUEST, 0, 0) + body)

    def _resolve_family(self) -> int:
        self._send(
            _GENL_ID_CTRL, _CTRL_CMD_GETFAMILY, _attr(_CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0")
        )
        reply = self._sock.recv(65536)
        if struct.unpack_from("H", reply, 4)[0] == _NLMSG_ERROR:
            raise OSError("the kernel has no taskstats (CONFIG_TASKSTATS)")
        for kind, value in _attrs(reply[20:]):
            if kind == _CTRL_ATTR_FAMILY_ID:
                return int(struct.unpack("H", value[:2])[0])
        raise OSError("taskstats family id not found")

    def _request(self, attr: int) -> None:
        self._send(self._family, _TASKSTATS_CMD_GET, _attr(attr, self._mask))

    def _read(self) -> None:
        while not self._closed:
            try:
                data = self._sock.recv(1 << 16)
            except OSError as exc:
                if self._closed:
                    return
                if exc.errno == 105:  # ENOBUFS: the kernel dropped records
                    self.overflowed = self.overflowed or self._recording
                    continue
                return
            off = 0
            while off + 16 <= len(data):
                size = struct.unpack_from("I", data, off)[0]
                if size < 16:
                    break
                self._parse(data[off + 20 : off + size])
                off += (size + 3) & ~3

    def _parse(self, payload: bytes) -> None:
        for kind, value in _attrs(payload):
            if kind != _TYPE_AGGR_PID:
                continue
            inner = dict(_attrs(value))
            stats = inner.get(_TYPE_STATS)
            if _TYPE_PID not in inner or stats is None or len(stats) < _OFF_UTIME + 16:
                continue
            if struct.unpack_from("I", stats, _OFF_PPID)[0] != self.ppid:
                continue
            pid = struct.unpack("I", inner[_TYPE_PID][:4])[0]
            utime, stime = struct.unpack_from("QQ", stats, _OFF_UTIME)
            with self._lock:
                if self._recording:
                    self.exits[pid] = (utime + stime) / 1e6

    def begin(self) -> None:
        with self._lock:
            self.exits = {}
            self.overflowed = False
            self._recording = True

    def end(self, settle_s: float = 0.3) -> dict[int, float]:
        time.sleep(settle_s)  # let records of exits before now reach the reader thread
        with self._lock:
            self._recording = False
            return dict(self.exits)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._request(_CMD_ATTR_DEREGISTER_CPUMASK)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def exit_listener(ppid: int) -> tuple[ExitListener | None, str]:
    """An ExitListener, or None and why not."""
    try:
        return ExitListener(ppid), "taskstats"
    except OSError as exc:
        return None, f"unavailable ({exc}); CPU of backends that exited in the window is missing"


# ------------------------------------------------------------------------ the server's CPU


class ServerCpu:
    """The CPU of every process of a PostgreSQL server over a window, split afterwards into
    the backends of given pids ("ours") and the rest."""

    def __init__(self, postmaster: int, listener: ExitListener | None) -> None:
        self.postmaster = postmaster
        self.listener = listener
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.exits: dict[int, float] = {}
        self.postmaster_s = 0.0
        self.reaped_s = 0.0

    def start(self) -> None:
        self.first = children_cpu_s(self.postmaster)
        self.postmaster_s = -(cpu_s(self.postmaster) or 0.0)
        self.reaped_s = -reaped_children_cpu_s(self.postmaster)
        if self.listener is not None:
            self.listener.begin()

    def stop(self) -> None:
        self.last = children_cpu_s(self.postmaster)
        self.postmaster_s += cpu_s(self.postmaster) or 0.0
        self.reaped_s += reaped_children_cpu_s(self.postmaster)
        if self.listener is not None:
            self.exits = self.listener.end()

    def split(self, ours: set[int]) -> dict[str, Any]:
        """CPU seconds in the window of our backends and of the rest of the server."""
        mine = other = 0.0
        exited_ours = 0
        for pid in set(self.first) | set(self.last) | set(self.exits):
            end = self.exits.get(pid, self.last.get(pid))
            if end is None:
                continue  # exited unseen (no exit records): in reaped_s only
            delta = max(0.0, end - self.first.get(pid, 0.0))  # born in the window: from 0
            if pid in ours:
                mine += delta
                exited_ours += pid in self.exits
            else:
                other += delta
        return {
            "ours": mine,
            "rest": other + max(0.0, self.postmaster_s),
            "our_backends": len(ours),
            "our_backends_exited": exited_ours,
            # Cross-check of the exit records: the whole CPU of the children the server reaped
            # in the window, by the kernel's records and by the postmaster's cutime + cstime.
            "exited_cpu_by_exit_records": sum(self.exits.values()),
            "exited_cpu_by_cutime": self.reaped_s,
            "exit_records_lost": bool(self.listener and self.listener.overflowed),
        }
