"""hfai.data read throughput against one-file-per-sample reads, measured in the same run.

Builds a >1 GB ffrecord file of 4 KiB samples and the same samples as one file each, under a
temporary directory that is removed at the end. Prints samples/s and MB/s (1 MB = 10^6 bytes) for
batches of 128 random indices with a warm page cache and a cold one (``drop_caches`` when
permitted, else ``posix_fadvise(DONTNEED)`` on every file, which leaves directory entries and
inodes cached and so flatters the small files), with checksums on, and a DataLoader epoch with
0 and 2 workers. Run: ``python bench/bench_data.py [--samples N] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from hfai.data import FileReader, FileWriter
from hfai.data.checksum import BACKEND

SAMPLE = 4096
BATCH = 128


def small_path(root: str, i: int) -> str:
    return os.path.join(root, f"{i % 256:03d}", f"{i}.bin")


def build(root: str, n: int) -> tuple[str, str, float, float]:
    rng = np.random.default_rng(0)
    ffr, small = os.path.join(root, "data.ffr"), os.path.join(root, "small")
    chunks = 1024  # generate random bytes a chunk of samples at a time
    t = time.perf_counter()
    with FileWriter(ffr, n) as w:
        for first in range(0, n, chunks):
            block = rng.integers(0, 256, size=(min(chunks, n - first), SAMPLE), dtype=np.uint8)
            for row in block:
                w.write_one(row)
    t_ffr = time.perf_counter() - t
    for d in range(256):
        os.makedirs(os.path.join(small, f"{d:03d}"))
    t = time.perf_counter()
    with FileReader(ffr, check_data=False) as r:
        for first in range(0, n, chunks):
            for i, data in enumerate(r.read(range(first, min(first + chunks, n))), first):
                with open(small_path(small, i), "wb") as f:
                    f.write(data)
    t_small = time.perf_counter() - t
    return ffr, small, t_ffr, t_small


def drop_caches(ffr: str, small: str, n: int) -> str:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        for path in [ffr] + [small_path(small, i) for i in range(n)]:
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        return "posix_fadvise(DONTNEED)"


def batches(n: int, count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n, BATCH).tolist() for _ in range(count)]


def time_ours(reader: FileReader, plan) -> float:
    t = time.perf_counter()
    for b in plan:
        reader.read(b)
    return time.perf_counter() - t


def time_small(small: str, plan) -> float:
    t = time.perf_counter()
    for b in plan:
        for i in b:
            with open(small_path(small, i), "rb") as f:
                f.read()
    return time.perf_counter() - t


def rate(plan, seconds: float) -> float:
    return len(plan) * BATCH / seconds


def line(label: str, samples_per_s: float) -> None:
    print(f"  {label:<34} {samples_per_s:>11,.0f} samples/s {samples_per_s * SAMPLE / 1e6:>9,.1f} MB/s")


def measure(label, run, make_plan, repeats, before=None) -> float:
    rates = []
    for k in range(repeats):
        plan = make_plan(k)
        if before:
            before()
        rates.append(rate(plan, run(plan)))
    best = statistics.median(rates)
    line(label, best)
    return best


def bench_random(ffr, small, n, threads):
    print(f"random batches of {BATCH} x {SAMPLE} B, checksums on ({BACKEND} CRC-32), median of 3 runs")
    warm = FileReader(ffr, check_data=True, threads=threads)
    warm.validate()  # reads the whole file once: warms the cache and checks every sample
    time_small(small, batches(n, n // BATCH + 1, 99))  # touch (most of) the small files too
    print("warm page cache:")
    ours = measure("hfai.data FileReader (io=auto)", lambda p: time_ours(warm, p), lambda k: batches(n, 2000, k), 3)
    line_off = FileReader(ffr, check_data=False)
    measure("hfai.data, checksums off", lambda p: time_ours(line_off, p), lambda k: batches(n, 2000, k), 3)
    base = measure("one file per sample", lambda p: time_small(small, p), lambda k: batches(n, 300, 10 + k), 3)
    print(f"RATIO warm  hfai.data / one-file-per-sample: {ours / base:.2f}x  (target >= 6x; original ffrecord ~4.3x)")

    for r in (warm, line_off):
        r.close()

    print("cold page cache:")
    how: list[str] = []
    ours = measure_cold(f"hfai.data FileReader ({threads} threads)", ffr, small, n, how, 80, 20, threads=threads)
    measure_cold("hfai.data io=mmap (no read threads)", ffr, small, n, how, 20, 30, io="mmap")
    base = measure("one file per sample", lambda p: time_small(small, p), lambda k: batches(n, 40, 40 + k), 3,
                   lambda: how.append(drop_caches(ffr, small, n)))
    print(f"  (cache dropped with {how[0]})")
    print(f"RATIO cold  hfai.data / one-file-per-sample: {ours / base:.2f}x  (target >= 2.5x; original ffrecord ~1.6x)")


def measure_cold(label, ffr, small, n, how, count, seed, **options) -> float:
    """Each run: drop the cache, then open a fresh reader (untimed) and time its batches.

    Fresh, because pages a reader has mapped stay in its page tables and survive drop_caches.
    """
    readers: list[FileReader] = []

    def before():
        for r in readers:
            r.close()
        how.append(drop_caches(ffr, small, n))
        readers.append(FileReader(ffr, check_data=True, **options))

    result = measure(label, lambda p: time_ours(readers[-1], p), lambda k: batches(n, count, seed + k), 3, before)
    readers[-1].close()
    return result


def bench_loader(ffr, small, n):
    import torch.utils.data

    from hfai.data import Dataset

    class SmallFiles(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            with open(small_path(small, i), "rb") as f:
                return np.frombuffer(bytearray(f.read()), dtype=np.uint8)  # writable, as torch wants

    print(f"DataLoader epoch over all {n} samples, batch {BATCH}, shuffled, warm cache:")
    for workers in (0, 2):
        results = {}
        for name, make in (("hfai.data Dataset.loader", lambda: Dataset(ffr).loader(BATCH, num_workers=workers)),
                           ("one file per sample", lambda: torch.utils.data.DataLoader(
                               SmallFiles(), batch_size=BATCH, shuffle=True, num_workers=workers))):
            loader = make()
            t = time.perf_counter()
            count = sum(len(b) for b in loader)
            results[name] = count / (time.perf_counter() - t)
            line(f"{name}, {workers} workers", results[name])
        ratio = results["hfai.data Dataset.loader"] / results["one file per sample"]
        print(f"RATIO loader {workers} workers hfai.data / one-file-per-sample: {ratio:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=270_000, help="4 KiB samples (default: 1.1 GB)")
    parser.add_argument("--threads", type=int, default=16, help="FileReader read threads")
    parser.add_argument("--dir", default=None, help="parent of the temporary directory")
    parser.add_argument("--no-loader", action="store_true", help="skip the DataLoader epochs")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="hfai-bench-data-", dir=args.dir)
    try:
        n = args.samples
        ffr, small, t_ffr, t_small = build(root, n)
        size = os.path.getsize(ffr)
        print(f"hfai.data benchmark: {n} samples of {SAMPLE} B, record file {size / 1e9:.2f} GB, {os.cpu_count()} CPUs")
        print(f"write: one record file {t_ffr:.1f} s, {n} small files {t_small:.1f} s")
        bench_random(ffr, small, n, args.threads)
        if not args.no_loader:
            bench_loader(ffr, small, n)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
