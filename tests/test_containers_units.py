"""The compute container's pure parts (agent/sandbox.py: the layout and bwrap's options) and the
run cgroup's file protocol (agent/cgroup.py) against a folder laid out as the kernel's, for both
cgroup v1 and v2 (this machine has only v1; tests/test_containers_live.py uses it for real)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from waits import wait_for

from hfai.agent.cgroup import (
    CGROUP_FS,
    LEFT_AGE_S,
    V1_CONTROLLERS,
    CgroupKind,
    CgroupSetup,
    RunCgroup,
    Usage,
    parse_flat_keyed,
    remove_left,
)
from hfai.agent.contain import run_memory_limit
from hfai.agent.sandbox import (
    BindMode,
    ContainerPaths,
    Mount,
    bwrap_args,
    interpreter_paths,
    plan_mounts,
    signal_status,
)

WAIT_S = 30.0  # a bound on waits on two shared cores, not a timing
HIDDEN_FOR_TEST = ("/etc/shadow", "/etc/hfai")
HOST = {"/usr": "dir", "/bin": "link:usr/bin", "/lib": "link:usr/lib", "/etc": "dir", "/etc/shadow": "file",
        "/etc/hfai": "dir"}


def _paths(**kw) -> ContainerPaths:
    base = dict(user="alice", workdir="/ws/alice/proj", control_dir="/var/lib/hfai/agent/control/j.1",
                control_inside="/run/hfai/control", runtime=("/opt/py", "/opt/py/lib", "/srv/hfai"),
                home="/homes/alice", writable=("/ws/alice",), public_datasets=(("coco", "/data/coco"),),
                private_datasets=(("med", "/data/med"),), devices=("/dev/nvidia0",), host=HOST)
    return ContainerPaths(**{**base, **kw})


def test_the_layout_is_the_guides_and_holds_nothing_else():
    mounts = plan_mounts(_paths())
    by_dst = {m.dst: m for m in mounts}
    assert by_dst["/usr"] == Mount(BindMode.RO, "/usr", "/usr")
    assert by_dst["/bin"] == Mount(BindMode.LINK, "/bin", "usr/bin")  # a merged /usr stays a link
    assert by_dst["/etc/shadow"].mode is BindMode.HIDE_FILE and by_dst["/etc/hfai"].mode is BindMode.HIDE_DIR
    assert by_dst["/opt/py"].mode is BindMode.RO and "/opt/py/lib" not in by_dst  # the outer bind shows it
    assert by_dst["/home/alice"] == Mount(BindMode.RW, "/home/alice", "/homes/alice")
    assert by_dst["/public_dataset/coco"] == Mount(BindMode.RO, "/public_dataset/coco", "/data/coco")
    assert by_dst["/public_dataset/1/ffdataset"] == Mount(BindMode.LINK, "/public_dataset/1/ffdataset",
                                                          "/public_dataset")
    assert by_dst["/private_dataset/med"].mode is BindMode.RO
    # The workdir lies in the user's workspaces: one read-write bind shows both.
    assert by_dst["/ws/alice"].mode is BindMode.RW and "/ws/alice/proj" not in by_dst
    assert by_dst["/run/hfai/control"] == Mount(BindMode.RW, "/run/hfai/control", "/var/lib/hfai/agent/control/j.1")
    assert by_dst["/dev/nvidia0"].mode is BindMode.DEV
    # Nothing of the agent's state but the control directory, bound elsewhere.
    assert not [m for m in mounts if m.dst.startswith("/var/lib/hfai")]
    # Hidden entries come after the system binds they lie in, writable ones after read-only ones.
    order = [m.dst for m in mounts]
    assert order.index("/etc") < order.index("/etc/shadow")
    assert order.index("/opt/py") < order.index("/ws/alice")


def test_sys_is_bound_after_every_other_mount_but_one_inside_it():
    # /sys brings its own mounts (the cgroup hierarchies) into the table that bwrap reads again
    # for every later bind: bound last, none of those reads go over them.
    host = {**HOST, "/sys": "dir", "/opt": "dir"}
    order = [m.dst for m in plan_mounts(_paths(host=host))]
    assert order[-1] == "/sys" and order.index("/dev/nvidia0") < order.index("/sys")
    # Were something mounted inside it, /sys stays before it (else it would cover it).
    order = [m.dst for m in plan_mounts(_paths(host={**host, "/sys/firmware": "dir"},
                                               hidden=(*HIDDEN_FOR_TEST, "/sys/firmware")))]
    assert order.index("/sys") < order.index("/sys/firmware")


def test_no_home_no_private_datasets_and_absent_system_folders():
    mounts = plan_mounts(_paths(home="", private_datasets=(), host={"/usr": "dir"}))
    by_dst = {m.dst: m for m in mounts}
    assert by_dst["/home/alice"].mode is BindMode.DIR  # an empty home of the container's own
    assert "/private_dataset" not in by_dst and "/etc" not in by_dst and "/lib64" not in by_dst


def test_bwrap_options():
    c = _paths(tmp_bytes=2**30, shm_bytes=2**31)
    args = bwrap_args(c, plan_mounts(c))
    for flag in ("--unshare-pid", "--die-with-parent", "--new-session"):
        assert flag in args
    assert "--unshare-net" not in args and "--unshare-all" not in args  # the host's network
    i = args.index("/tmp")
    assert args[i - 3: i + 1] == ["--size", str(2**30), "--tmpfs", "/tmp"]
    i = args.index("/dev/shm")
    assert args[i - 3: i + 1] == ["--size", str(2**31), "--tmpfs", "/dev/shm"]
    assert args[args.index("--symlink") + 1: args.index("--symlink") + 3] == ["usr/bin", "/bin"]
    at = args.index("/etc/shadow")
    assert args[at - 2: at + 1] == ["--ro-bind", "/dev/null", "/etc/shadow"]
    assert args[-2:] == ["--chdir", "/ws/alice/proj"]
    # Unsized: folders of bwrap's own tmpfs (root, /dev), private all the same, a mount fewer each.
    plain = bwrap_args(_paths(), plan_mounts(_paths()))
    i = plain.index("/tmp")
    assert plain[i - 3: i + 1] == ["--perms", "1777", "--dir", "/tmp"] and "/dev/shm" not in plain


def test_exit_status_through_bwrap():
    # bwrap exits 128+N for a job killed by signal N: the platform says -N, as for a bare process.
    assert signal_status(137) == -9 and signal_status(143) == -15
    assert signal_status(0) == 0 and signal_status(1) == 1 and signal_status(128) == 128 and signal_status(255) == 255


def test_memory_limit():
    assert run_memory_limit(100 * 2**30, 4 * 2**30, 0) == 96 * 2**30
    assert run_memory_limit(100 * 2**30, 4 * 2**30, 8 * 2**30) == 8 * 2**30  # as configured
    assert run_memory_limit(6 * 2**30, 4 * 2**30, 0) == 3 * 2**30  # less than twice the reserve: half


def test_interpreter_paths_hold_this_interpreter_and_hfai():
    paths = interpreter_paths(sys.executable)
    import hfai

    for needed in (sys.prefix, sys.base_prefix, str(Path(hfai.__file__).resolve().parent)):
        assert any(needed == p or needed.startswith(p + "/") for p in paths), (needed, paths)


def _fake_v1(root: Path) -> tuple[str, ...]:
    dirs = []
    for ctrl in ("memory", "pids"):
        d = root / ctrl / "hfai" / "n0"
        d.mkdir(parents=True)
        dirs.append(str(d / "run.1"))
    return tuple(dirs)


def test_v1_cgroup_files(tmp_path):
    dirs = _fake_v1(tmp_path)
    cg = RunCgroup.create(CgroupKind.V1, dirs, memory_bytes=2**30, pids_max=100)
    mem, pids = (Path(d) for d in dirs)
    assert (mem / "memory.limit_in_bytes").read_text() == str(2**30)
    assert (pids / "pids.max").read_text() == "100"
    cg.join(4242)
    assert all((Path(d) / "cgroup.procs").read_text() == "4242\n" for d in dirs)
    (mem / "memory.max_usage_in_bytes").write_text("123456\n")
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert cg.usage() == Usage(peak_bytes=123456, cpu_s=0.0, oom_kills=2)  # CPU: the launcher's rusage


def test_v2_cgroup_files(tmp_path):
    run = tmp_path / "agent-cg" / "hfai-n0" / "run.1"
    run.parent.mkdir(parents=True)
    cg = RunCgroup.create(CgroupKind.V2, (str(run),), memory_bytes=2**30, pids_max=100)
    assert (run / "memory.max").read_text() == str(2**30) and (run / "pids.max").read_text() == "100"
    (run / "memory.peak").write_text("777\n")
    (run / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (run / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\n")
    assert cg.usage() == Usage(peak_bytes=777, cpu_s=1.5, oom_kills=1)


def test_a_run_cgroup_is_made_joined_read_and_removed_with_os_calls(tmp_path, monkeypatch):
    # The launcher, forked from the zygote, does this on every run's path: pathlib's and the text
    # layer's Python code there copied pages from the zygote (about 70 page faults a run,
    # docs/performance.md). The files' protocol is the same as through pathlib.
    dirs = _fake_v1(tmp_path)

    def refuse(*_a, **_k):
        raise AssertionError("pathlib on the launcher's path")

    for name in ("mkdir", "rmdir", "write_text", "read_text", "open"):
        monkeypatch.setattr(Path, name, refuse)
    cg = RunCgroup.create(CgroupKind.V1, dirs, memory_bytes=2**30, pids_max=100)
    assert isinstance(cg.dirs[0], str)
    cg.join(4242)
    assert cg.members() == {4242}
    mem = dirs[0]
    for name, text in (("memory.max_usage_in_bytes", "123456\n"), ("memory.oom_control", "oom_kill 2\n")):
        with open(os.path.join(mem, name), "w") as f:
            f.write(text)
    assert cg.usage() == Usage(peak_bytes=123456, cpu_s=0.0, oom_kills=2)
    assert not cg.remove()  # the fake folders hold files: not removed, and no error
    for d in dirs:
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
    assert cg.remove() and not any(os.path.exists(d) for d in dirs)


def test_kill_all_spares_the_launcher_and_returns_when_the_cgroup_is_empty(tmp_path):
    dirs = _fake_v1(tmp_path)
    cg = RunCgroup.create(CgroupKind.V1, dirs, 0, 0)
    (Path(dirs[0]) / "cgroup.procs").write_text(f"{os.getpid()}\n")
    assert cg.kill_all(spare=os.getpid()) == 0  # only the launcher itself: nothing to kill


def test_an_earlier_agents_empty_run_cgroups_go_and_nothing_else(tmp_path):
    """What an agent that stopped between a run's end and its clean-up left: empty run cgroups,
    removed by the node's next agent (cgroup.remove_left). Not one a process holds (a folder with
    a file here: its rmdir fails as a busy cgroup's does), not one made moments ago (another
    cluster's launcher may be about to join it), not a folder that is no run's."""
    bases = tuple(str(tmp_path / ctrl / "hfai" / "n0") for ctrl in ("memory", "pids"))
    for base in bases:
        os.makedirs(os.path.join(base, "j1.1"))
        os.makedirs(os.path.join(base, "j2.3"))
        Path(base, "j2.3", "cgroup.procs").write_text("4242\n")
        os.makedirs(os.path.join(base, "not-a-run"))
    setup = CgroupSetup(CgroupKind.V1, bases)
    assert remove_left(setup) == 0  # all made just now
    assert remove_left(setup, now=time.time() + LEFT_AGE_S + 1) == 2
    for base in bases:
        assert sorted(os.listdir(base)) == ["j2.3", "not-a-run"]


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(f"{CGROUP_FS}/memory", os.W_OK), reason="no writable cgroup v1")
def test_remove_left_on_the_kernels_cgroups_spares_a_live_runs():
    bases = tuple(f"{CGROUP_FS}/{ctrl}/hfai-test-left/n{os.getpid()}" for ctrl in V1_CONTROLLERS)
    setup = CgroupSetup(CgroupKind.V1, bases)
    busy, idle = RunCgroup(CgroupKind.V1, setup.for_run("j1.1")), RunCgroup(CgroupKind.V1, setup.for_run("j2.1"))
    for d in (*busy.dirs, *idle.dirs):
        os.makedirs(d)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        busy.join(proc.pid)
        assert remove_left(setup, now=time.time() + LEFT_AGE_S + 1) == 2  # the idle run's, in both
        assert all(os.path.isdir(d) for d in busy.dirs) and not any(os.path.exists(d) for d in idle.dirs)
    finally:
        proc.kill()
        proc.wait()
        wait_for(busy.remove, WAIT_S, "the sleeper's cgroup to empty", poll=0.01)
        for base in bases:
            for d in (base, os.path.dirname(base)):
                try:
                    os.rmdir(d)
                except OSError:
                    pass


@pytest.mark.parametrize("text,expected", [("oom_kill 3\nunder_oom 0\n", {"oom_kill": 3, "under_oom": 0}),
                                           ("garbage\nx y\n", {})])
def test_flat_keyed(text, expected):
    assert parse_flat_keyed(text) == expected


def test_a_notebooks_link_a_user_planted_is_not_followed(tmp_path):
    # The agent (root) makes <notebooks_root>/<user>/notebooks 0700 and the user's; a user who put
    # a link there must not get the agent to chmod or chown what it points to.
    from hfai.agent.cgroup import CgroupSetup
    from hfai.agent.contain import Containment
    from hfai.agent.identity import agent_account, job_identity, lookup_account
    from hfai.agent.sandbox import NoSandbox

    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    outside.chmod(0o755)
    (tmp_path / "nb" / "alice").mkdir(parents=True)
    (tmp_path / "nb" / "alice" / "notebooks").symlink_to(outside)
    c = Containment(sandbox=NoSandbox(), cgroups=CgroupSetup(CgroupKind.NONE))
    who = job_identity("alice", "agent", agent_account(), lookup_account)
    with pytest.raises(OSError):
        c._writable("alice", who, {"HFAI_NOTEBOOKS_DIR": str(tmp_path / "nb" / "alice" / "notebooks")})
    assert outside.stat().st_mode & 0o777 == 0o755
    fresh = tmp_path / "nb" / "bob" / "notebooks"
    assert c._writable("bob", who, {"HFAI_NOTEBOOKS_DIR": str(fresh)}) == (str(fresh),)
    assert fresh.stat().st_mode & 0o777 == 0o700 and fresh.parent.stat().st_mode & 0o777 == 0o700
