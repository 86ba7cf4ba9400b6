"""Workspace push against ``rsync -a`` of the same tree, in the same run, on this machine.

Each case is pushed with ``hfai workspace push`` to a real local cluster (nats-server,
controller, agent, hfai-storage; chunks go through NATS to the storage service, which writes them
into the workspace root) and copied by two peers:

  * ``rsync -a`` to a local directory (no network, no daemon: the floor);
  * ``rsync -a`` over ssh to a local sshd on 127.0.0.1 (a port of its own, started and stopped by
    this script: Debian's ``openssh-server``), the way a workstation reaches a login node.

Cases:

  * many files: 1 GB in 10,000 files;
  * one file: one 1 GB file;
  * no change: the many-files tree pushed (and rsynced) again unchanged;
  * one edit: one line of one file of the many-files tree changed, pushed again (the everyday case);
  * small files: a source tree of ``HFAI_BENCH_WS_SMALL`` files of some 100 bytes (default
    1,000,000; 0 skips it), pushed once, with the peak memory of the push process and of rsync
    (its manifest is larger than one NATS message: it travels in pieces).

Before each timed command the page cache's dirty pages are written out (``sync``, not timed), so
that no command pays for the writeback of the one before it.

Each case runs ``HFAI_BENCH_WS_ROUNDS`` times (default 3), the three commands taking turns, and
the medians are compared: on this kind of machine one push or copy of 1 GB can take twice as long
as the next (the kernel's page-cache writes vary that much from one run to another), so the
figures of each round are printed too. A copying round sends to a workspace and directories of
its own, so each copies everything.

Prints seconds for each and the ratios hfai/rsync (lower is better for hfai). Scale everything
down with ``HFAI_BENCH_WS_MB`` (default 1000) and ``HFAI_BENCH_WS_FILES`` (default 10000); set
``HFAI_BENCH_WS_SSH=0`` to skip the ssh peer (e.g. without openssh-server), and
``HFAI_BENCH_WS_ONLY=small`` to run only the small-files case.

    python bench/bench_workspace.py            # the full 1 GB cases (minutes here)
    HFAI_BENCH_WS_MB=200 HFAI_BENCH_WS_FILES=2000 python bench/bench_workspace.py   # quick
    HFAI_BENCH_WS_ONLY=small HFAI_BENCH_WS_SMALL=100000 HFAI_BENCH_WS_SSH=0 python bench/bench_workspace.py
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from hfai.cli.local import LocalCluster

MB = 1_000_000


def make_tree(root: Path, total: int, files: int) -> None:
    root.mkdir(parents=True)
    per = total // files
    for i in range(files):
        d = root / f"d{i % 100:02d}"
        d.mkdir(exist_ok=True)
        (d / f"f{i:05d}.bin").write_bytes(os.urandom(per))


def edit_one(root: Path) -> None:
    """Change a few bytes in the middle of one file (an edited line)."""
    f = root / "d07" / "f00007.bin"
    with open(f, "r+b") as out:
        out.seek(f.stat().st_size // 2)
        out.write(b"# edited\n")


def make_small_tree(root: Path, files: int) -> None:
    """``files`` files of some 100 bytes, a thousand a directory (a source tree's shape)."""
    for i in range(files):
        d = root / f"pkg{i // 1000:04d}"
        if i % 1000 == 0:
            d.mkdir(parents=True)
        (d / f"mod{i % 1000:03d}.py").write_bytes(b"# module %d\n" % i + b"x = 1\n" * 14)


def timed_rss(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """:func:`timed`, and the command's peak resident memory in MB (its own, from wait4)."""
    os.sync()
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    took = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {err.decode(errors='replace').strip()[-500:]}")
    return took, usage.ru_maxrss / 1024


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    # Each command starts with no dirty pages left by the one before (or by making the trees):
    # otherwise whichever runs next pays for the previous one's writeback, and the fixed order of
    # the cases decides the ratios. None of the three fsyncs its files, so each is timed as its
    # user sees it, with its own writes still in the page cache.
    os.sync()
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
    return time.perf_counter() - t


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_sshd(base: Path) -> Iterator[list[str]]:
    """An sshd on 127.0.0.1 only, with throwaway host and client keys; yields the ssh command
    (for ``rsync -e``) that logs into it. Stopped (and its files removed) on exit."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd):
        sys.exit("sshd is not installed (apt-get install -y openssh-server), or set HFAI_BENCH_WS_SSH=0")
    d = base / "sshd"
    d.mkdir(mode=0o700)
    for key in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    shutil.copy(d / "client.pub", d / "authorized_keys")
    port = _free_port()
    (d / "sshd_config").write_text("\n".join([
        f"ListenAddress 127.0.0.1:{port}", f"HostKey {d / 'host'}", f"AuthorizedKeysFile {d / 'authorized_keys'}",
        f"PidFile {d / 'sshd.pid'}", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password", "StrictModes no", "UsePAM no", "Subsystem sftp internal-sftp", ""]))
    os.makedirs("/run/sshd", exist_ok=True)  # its privilege-separation directory
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.DEVNULL)
    ssh = ["ssh", "-p", str(port), "-i", str(d / "client"), "-o", "StrictHostKeyChecking=no", "-o",
           "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes"]
    try:
        for _ in range(100):
            if subprocess.run([*ssh, "127.0.0.1", "true"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            sys.exit("the local sshd did not let us in")
        yield ssh
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    total = int(os.environ.get("HFAI_BENCH_WS_MB", "1000")) * MB
    nfiles = int(os.environ.get("HFAI_BENCH_WS_FILES", "10000"))
    use_ssh = os.environ.get("HFAI_BENCH_WS_SSH", "1") != "0"
    rounds = max(1, int(os.environ.get("HFAI_BENCH_WS_ROUNDS", "3")))
    small = int(os.environ.get("HFAI_BENCH_WS_SMALL", "1000000"))
    only_small = os.environ.get("HFAI_BENCH_WS_ONLY", "") == "small"
    rsync = shutil.which("rsync")
    if rsync is None:
        sys.exit("rsync is not installed: the benchmark compares against it")
    base = Path(tempfile.mkdtemp(prefix="hfai-bench-ws-"))
    cluster = LocalCluster(root=base / "cluster", nodes=1)
    try:
        with contextlib.ExitStack() as stack:
            ssh = stack.enter_context(local_sshd(base)) if use_ssh else None
            cluster.up()
            cluster.wait_ready()
            rows = [] if only_small else run_cases(cluster, base, rsync, ssh, total, nfiles, rounds)
            small_row = run_small(cluster, base, rsync, small) if small else None
        if small_row is not None:
            (t_hfai, rss_hfai), (t_rsync, rss_rsync) = small_row
            print(f"small files: {small} files of ~100 B: hfai push {t_hfai:7.2f} s, {rss_hfai:6.0f} MB peak   "
                  f"rsync -a {t_rsync:7.2f} s, {rss_rsync:6.0f} MB peak   hfai/rsync {t_hfai / t_rsync:6.2f}")
        if only_small:
            return
        print(f"workspace push vs rsync, {total / MB:.0f} MB; many files: {nfiles} files; medians of {rounds} "
              f"round(s); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        for label, size, t_hfai, t_rsync, t_ssh, times in rows:
            line = (f"{label:<11} hfai push {t_hfai:7.2f} s   rsync -a {t_rsync:7.2f} s   hfai/rsync "
                    f"{t_hfai / t_rsync:6.2f}")
            if t_ssh is not None:
                line += f"   rsync ssh {t_ssh:7.2f} s   hfai/rsync-ssh {t_hfai / t_ssh:6.2f}"
            if size:
                line += f"   ({size / MB / t_hfai:6.1f} MB/s vs {size / MB / t_rsync:6.1f} MB/s)"
            print(line)
            if rounds > 1:
                print("            each round: " + "; ".join(
                    f"{who} " + " ".join(f"{t:.2f}" for t in ts)
                    for who, ts in zip(("hfai", "rsync", "ssh"), times, strict=False) if ts))
    finally:
        cluster.down()
        shutil.rmtree(base, ignore_errors=True)


def _env(cluster: LocalCluster) -> dict[str, str]:
    # Without PYTHONDONTWRITEBYTECODE: with it, every hfai command would compile every hfai module
    # it imports from source (tens of milliseconds a call), where an installed hfai has its bytecode.
    env = {k: v for k, v in os.environ.items() if not k.startswith("HFAI_NATS_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["HFAI_CONFIG"] = str(cluster.config_path)
    return env


def run_small(cluster: LocalCluster, base: Path, rsync: str, files: int) -> tuple[tuple[float, float], ...]:
    """One push of a tree of ``files`` small files, and one ``rsync -a`` of it: (seconds, MB)."""
    env, hfai = _env(cluster), [sys.executable, "-m", "hfai.cli.main"]
    tree = base / "small"
    make_small_tree(tree, files)
    timed([*hfai, "workspace", "init", "small"], tree, env)
    return timed_rss([*hfai, "workspace", "push"], tree, env), timed_rss([rsync, "-a", f"{tree}/",
                                                                          str(base / "rsync-small")], base, env)


def run_cases(cluster: LocalCluster, base: Path, rsync: str, ssh: list[str] | None, total: int, nfiles: int,
              rounds: int) -> list:
    """Each case ``rounds`` times, hfai and its peers taking turns; the medians. A round of the
    copying cases sends to a workspace (and directories) of its own, so each copies everything."""
    env = _env(cluster)
    hfai = [sys.executable, "-m", "hfai.cli.main"]
    many, one = base / "many", base / "one"
    make_tree(many, total, nfiles)
    one.mkdir()
    with open(one / "big.bin", "wb") as f:
        for _ in range(total // MB):
            f.write(os.urandom(MB))
    for peer in ("rsync", "rsync-ssh"):
        (base / peer).mkdir()
    rows = []
    for label, tree in (("one file", one), ("many files", many), ("no change", many), ("one edit", many)):
        times: list[list[float]] = [[], [], []]
        for i in range(rounds):
            # The copying cases' last round leaves the tree where no change and one edit start.
            dest = f"{tree.name}-{i}" if label in ("many files", "one file") else f"{tree.name}-{rounds - 1}"
            if label == "one edit":
                edit_one(tree)
            elif label != "no change":
                timed([*hfai, "workspace", "init", dest], tree, env)
            times[0].append(timed([*hfai, "workspace", "push"], tree, env))
            times[1].append(timed([rsync, "-a", f"{tree}/", str(base / "rsync" / dest)], base, env))
            if ssh is not None:
                times[2].append(timed([rsync, "-a", "-e", " ".join(ssh), f"{tree}/",
                                       f"127.0.0.1:{base / 'rsync-ssh' / dest}"], base, env))
        t_hfai, t_rsync = statistics.median(times[0]), statistics.median(times[1])
        t_ssh = statistics.median(times[2]) if times[2] else None
        rows.append((label, total if label in ("many files", "one file") else 0, t_hfai, t_rsync, t_ssh,
                     times))
    return rows


if __name__ == "__main__":
    main()
