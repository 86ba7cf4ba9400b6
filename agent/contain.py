"""How this node contains its runs: the container and the cgroup each run gets, chosen once at
agent start (:func:`make_containment`), and what one run's container holds (:meth:`Containment.wrap`).

``[agent] container``: ``"bwrap"`` (the default) or ``"none"``. A node that runs jobs as their
submitters (``run_as = "submitter"``) refuses to run them uncontained unless ``allow_uncontained``
is set too: without a container a job sees every process of the node and shares ``/tmp`` and
``/dev/shm`` with the others. Where bwrap cannot work, such a node does not start (one line says
why); a node that runs jobs as its own account (a local cluster) says why once and runs them
uncontained, which ``hfai nodes`` and ``hfai local status`` show.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hfai import base_envs
from hfai.agent import safefs
from hfai.agent.cgroup import CgroupKind, CgroupSetup, detect, remove_left
from hfai.agent.identity import RUN_AS_SUBMITTER, JobIdentity
from hfai.agent.launchspec import CgroupPlace, Limits
from hfai.agent.sandbox import (
    CONTAINER_BWRAP,
    CONTAINER_NONE,
    CONTROL_INSIDE,
    CREDS_INSIDE,
    PRIVATE_DATASETS,
    PUBLIC_DATASETS,
    BwrapSandbox,
    ContainerPaths,
    NoSandbox,
    Sandbox,
    find_bwrap,
    interpreter_paths,
    probe,
)
from hfai.protocol.errors import HfaiError
from hfai.protocol.names import is_token
from hfai.protocol.types import RunAssignment

__all__ = ["Containment", "ContainmentError", "enter_argv", "make_containment", "reachable", "run_memory_limit"]

log = logging.getLogger(__name__)


class ContainmentError(HfaiError):
    """This node may not run jobs the way its settings ask (one line: why, and what to set)."""


@dataclass
class Containment:
    """This node's containers and cgroups, and the settings each run's get."""

    sandbox: Sandbox
    cgroups: CgroupSetup
    memory_bytes: int = 0  # each run's memory limit (0: none)
    pids_max: int = 0
    tmp_bytes: int = 0
    shm_bytes: int = 0
    home_root: str = ""
    workspace_root: str = ""
    dataset_root: str = ""
    notebooks_root: str = ""
    nats_url: str = ""
    creds_dir: str = ""  # [nats] creds_dir: users' credentials on this node ("": none here)
    dev_idle_s: float | None = None
    # What is missing, in one line each ("" = nothing): shown in `hfai nodes`.
    notes: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        """One line for `hfai nodes` and `hfai local status`: how runs are contained here."""
        what = self.sandbox.name if self.sandbox.name != CONTAINER_NONE else "no container"
        cg = f"cgroup {self.cgroups.kind.value}" if self.cgroups.kind is not CgroupKind.NONE else "no cgroup"
        return "; ".join([f"{what}, {cg}", *self.notes])

    def wrap(self, ra: RunAssignment, who: JobIdentity, argv: list[str], env: dict[str, str], control_dir: str,
             run_as: str, python: str, env_root: str = "") -> tuple[list[str], Limits]:
        """The command line of ``ra``'s run inside its container, with ``env`` changed for inside,
        and the launch spec's containment part (container, cgroup, limits)."""
        cgroup = None
        if self.cgroups.kind is not CgroupKind.NONE:
            cgroup = CgroupPlace(self.cgroups.kind, self.cgroups.for_run(ra.key))
        spec = Limits(container=self.sandbox.name, memory_bytes=self.memory_bytes, pids_max=self.pids_max,
                      cgroup=cgroup)
        if self.sandbox.name == CONTAINER_NONE:
            return argv, spec
        account = who.account
        paths = ContainerPaths(
            user=ra.user, workdir=ra.workdir, control_dir=control_dir, control_inside=CONTROL_INSIDE,
            # The agent's own interpreter too: `hfai exec` starts its helper with it, inside. Only
            # what the job's user may reach: bwrap, run as that user, refuses a bind it cannot see.
            # And the cluster's environments: hf_env.set_env(NAME) switches to another one in-job.
            # All of them read-only (runtime binds are): the base environments' interpreters too.
            runtime=tuple(p for p in (*interpreter_paths(python), *interpreter_paths(sys.executable),
                                      *((env_root,) if env_root and os.path.isdir(env_root) else ()),
                                      *(b.path for b in base_envs.load(env_root or None)
                                        if b.path != "/" and os.path.isdir(b.path)))
                          if not who.switch or reachable(p, account.uid, account.groups + (account.gid,))),
            home=self._home(ra.user, who, run_as), writable=self._writable(ra.user, who, env),
            public_datasets=self._datasets(account.groups + (account.gid,), public=True),
            private_datasets=self._datasets(account.groups + (account.gid,), public=False),
            devices=tuple(sorted(glob.glob("/dev/nvidia*"))), tmp_bytes=self.tmp_bytes, shm_bytes=self.shm_bytes,
            files=self._creds(ra.user))
        self.inside_env(env, ra.user)
        return self.sandbox.wrap(argv, paths), spec

    def _creds(self, user: str) -> tuple[tuple[str, str], ...]:
        """The user's own credentials file where this node keeps users' files (a local cluster's
        creds folder), bound alone: the job's hfai commands act as its user, as outside."""
        if not self.creds_dir:
            return ()
        path = os.path.join(self.creds_dir, f"{user}.creds")
        return ((path, CREDS_INSIDE),) if is_token(user) and os.path.isfile(path) else ()

    def inside_env(self, env: dict[str, str], user: str) -> None:
        """Change a job's environment ``env`` for inside its container (its paths there). The
        cluster's config file is not there: what a job's hfai commands need of it comes as
        variables (the NATS address, the user's credentials)."""
        env.pop("HFAI_CONFIG", None)
        if self.nats_url:
            env["HFAI_NATS_URL"] = self.nats_url
        if self._creds(user):
            env["HFAI_NATS_CREDS"] = CREDS_INSIDE
        if self.dev_idle_s is not None:
            env["HFAI_DEV_IDLE_S"] = str(self.dev_idle_s)
        env["HOME"] = f"/home/{user}"
        env["HFAI_CONTROL_DIR"] = CONTROL_INSIDE
        if self.dataset_root:
            env["HFAI_DATASETS_DIR"] = PUBLIC_DATASETS
            env["HFAI_PRIVATE_DATASETS_DIR"] = PRIVATE_DATASETS
        env.pop("TMPDIR", None)  # the host's may not exist inside: the container's /tmp is the run's

    def _home(self, user: str, who: JobIdentity, run_as: str) -> str:
        """The user's persistent home on the host ("" : an empty one of the container's)."""
        if self.home_root:
            home = Path(self.home_root) / user
            if not home.is_dir():
                home.mkdir(mode=0o700, parents=True, exist_ok=True)
                if who.switch:
                    os.chown(home, who.account.uid, who.account.gid)
            return str(home)
        if run_as == RUN_AS_SUBMITTER and who.account.home not in ("", "/") and os.path.isdir(who.account.home):
            return who.account.home
        return ""  # the agent's own account's home holds the cluster's own files: never bound

    def _writable(self, user: str, who: JobIdentity, env: dict[str, str]) -> tuple[str, ...]:
        out = []
        if self.workspace_root:
            mine = Path(self.workspace_root) / user
            if mine.is_dir():
                out.append(str(mine))
        notebooks = env.get("HFAI_NOTEBOOKS_DIR")
        if notebooks:
            # <root>/<user>/notebooks and <root>/<user>: the user's alone. Made here, as bwrap
            # needs the folder to bind it (the session, inside, sees only the bound one); never
            # through a link the user put there (this runs as root).
            nb = Path(notebooks)
            nb.parent.parent.mkdir(parents=True, exist_ok=True)
            owner = (who.account.uid, who.account.gid) if who.switch else None
            safefs.private_dirs(nb.parent.parent, (nb.parent.name, nb.name), owner)
            out.append(notebooks)
        return tuple(out)

    def _datasets(self, gids: tuple[int, ...], public: bool) -> tuple[tuple[str, str], ...]:
        """The datasets of ``dataset_root`` that are public (readable by all), or private to one
        of ``gids`` (docs/storage.md: a private dataset is its group's, unreadable to others)."""
        if not self.dataset_root or not os.path.isdir(self.dataset_root):
            return ()
        out = []
        for entry in sorted(os.listdir(self.dataset_root)):
            if not is_token(entry):
                continue
            path = os.path.join(self.dataset_root, entry)
            try:
                st = os.stat(path)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                continue
            is_public = bool(st.st_mode & stat.S_IROTH)
            if public and is_public:
                out.append((entry, os.path.realpath(path)))
            elif not public and not is_public and st.st_gid in gids:
                out.append((entry, os.path.realpath(path)))
        return tuple(out)


def reachable(path: str, uid: int, gids: tuple[int, ...]) -> bool:
    """May ``uid`` (with groups ``gids``) pass through every folder down to ``path`` and read it?
    The owner's, the group's or the others' bits, as the kernel picks them (ACLs are not read)."""
    p = Path(path)
    for i, d in enumerate((p, *p.parents)):
        try:
            st = os.stat(d)
        except OSError:
            return False
        shift = 6 if st.st_uid == uid else 3 if st.st_gid in gids else 0
        bits = (st.st_mode >> shift) & 0o7
        need = 0o5 if i == 0 else 0o1  # read and enter the folder itself; enter its parents
        if bits & need != need:
            return False
    return True


def enter_argv(pid1: int, userns: bool) -> list[str]:
    """The command line prefix that runs a command in the container whose pid 1 is ``pid1``
    (``hfai exec``/``hfai shell``: the shell sees what the job sees). ``userns``: the container
    was made by an unprivileged bwrap (a user namespace, which the job's user may enter)."""
    nsenter = shutil.which("nsenter")
    if nsenter is None:
        raise ContainmentError("cannot enter the job's container: nsenter (util-linux) is not installed on this node")
    return [nsenter, f"--target={pid1}", "--mount", "--pid", *(("--user", "--preserve-credentials") if userns else ())]


def run_memory_limit(total_bytes: int, reserve_bytes: int, configured: int) -> int:
    """Each run's memory limit: as configured, else the node's memory less the agent's reserve
    (pure). A node with less than the reserve gives its runs half of what it has."""
    if configured > 0:
        return configured
    return total_bytes - reserve_bytes if total_bytes > 2 * reserve_bytes else total_bytes // 2


def make_containment(ac, node: str, storage_workspace_root: str, dataset_root: str, notebooks_root: str,
                     total_memory: int, nats_url: str = "", creds_dir: str = "",
                     dev_idle_s: float | None = None) -> Containment:
    """The containment ``[agent]`` settings ``ac`` ask for on this node; ContainmentError if this
    node may not run jobs so. Logs one line for whatever is missing."""
    kind = ac.container
    if kind not in (CONTAINER_BWRAP, CONTAINER_NONE):
        raise ContainmentError(f"[agent] container must be {CONTAINER_BWRAP!r} or {CONTAINER_NONE!r}, not {kind!r}")
    shared = ac.run_as == RUN_AS_SUBMITTER
    notes: list[str] = []
    sandbox: Sandbox = NoSandbox()
    if kind == CONTAINER_NONE:
        if shared and not ac.allow_uncontained:
            raise ContainmentError('[agent] container = "none" on a node that runs jobs as their submitters: '
                                   "jobs would see each other's processes and /tmp; set allow_uncontained = true "
                                   "to run them so anyway")
        notes.append("containers off ([agent] container = \"none\")")
    else:
        bwrap = find_bwrap()
        why = probe(bwrap)
        if why is None:
            assert bwrap is not None
            sandbox = BwrapSandbox(bwrap)
        elif shared and not ac.allow_uncontained:
            raise ContainmentError(f"{why}; jobs run as their submitters need containers "
                                   "(or set [agent] allow_uncontained = true)")
        else:
            notes.append(f"runs uncontained: {why}")
            log.warning("jobs on node %s run uncontained: %s", node, why)
    cgroups = detect(node, name=ac.cgroup_name) if ac.cgroups else CgroupSetup(CgroupKind.NONE, reason="cgroups off")
    if cgroups.kind is CgroupKind.NONE:
        notes.append(cgroups.reason)
        log.warning("runs on node %s get no memory or pids limit: %s", node, cgroups.reason)
    elif left := remove_left(cgroups):
        log.info("removed %d empty run cgroup(s) an earlier agent of node %s left behind", left, node)
    return Containment(
        sandbox=sandbox, cgroups=cgroups,
        memory_bytes=run_memory_limit(total_memory, ac.memory_reserve_bytes, ac.run_memory_bytes),
        pids_max=ac.run_pids_max, tmp_bytes=ac.container_tmp_bytes, shm_bytes=ac.container_shm_bytes,
        home_root=ac.home_root, workspace_root=storage_workspace_root, dataset_root=dataset_root,
        notebooks_root=notebooks_root, nats_url=nats_url, creds_dir=creds_dir, dev_idle_s=dev_idle_s, notes=notes)

