"""Integration: training scripts written as HFAiLab's public ones, run on a local cluster, preempted
by a HIGH job, resumed, and finished with the same weights as an uninterrupted run (docs/compat.md).

The data is made by the real converter (``hfai data convert``) from small generated sources and put
where the cluster's jobs find datasets (``HFAI_DATASETS_DIR``, the local cluster's dataset root).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ports import free_port
from spine_cluster import JOBS, Cluster

from hfai.protocol.types import ChainState, Priority

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

HFAI = str(Path(sys.executable).with_name("hfai"))



def _imagenet_source(root: Path) -> Path:
    """A tiny torchvision ImageFolder tree: 4 classes told apart by their colour."""
    rng = np.random.default_rng(0)
    for split, per_class in (("train", 16), ("val", 4)):
        for c in range(4):
            folder = root / split / f"n0000{c}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = np.zeros((16, 16, 3), np.uint8)
                pixels[..., c % 3] = 60 * (c + 1)
                pixels = np.clip(pixels + rng.integers(0, 40, pixels.shape), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"img{i}.JPEG")
    return root


def _corpus_source(path: Path) -> Path:
    words = "the cat sat on a mat while dogs ran over green hills and birds sang songs of spring rain".split()
    rnd = random.Random(0)
    path.write_text("".join(" ".join(rnd.choice(words) for _ in range(rnd.randint(5, 20))) + "\n"
                            for _ in range(48)))
    return path


def _convert(*args: str) -> None:
    done = subprocess.run([HFAI, "data", "convert", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _reference(script: str, args: list[str], work: Path, data_dir: Path) -> None:
    """The same training, uninterrupted, outside the platform (one node of two workers)."""
    env = dict(os.environ, HFAI_DATASETS_DIR=str(data_dir), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE="1", RANK="0")
    env.pop("HFAI_CONTROL_DIR", None)
    done = subprocess.run([sys.executable, script, *args], cwd=work, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _preempt_and_resume(c: Cluster, script: str, args: list[str], work: Path, started: str) -> str:
    """Run ``script`` LOW, preempt it with a HIGH job once ``started`` is in its log; its log at the end."""
    low = c.submit(["python", script, *args], name="pretrain", nodes=1, priority=Priority.LOW, workdir=work)
    c.wait_state(low.id, ChainState.RUNNING)
    c.wait(lambda: started in c.log(low.id), 120, f"{started!r} in the job's log")
    high = c.submit(["python", "-c", "print('urgent work done')"], name="urgent", nodes=1, priority=Priority.HIGH,
                    workdir=work)
    c.wait_state(high.id, ChainState.SUCCEEDED, timeout=90)
    done = c.wait_state(low.id, ChainState.SUCCEEDED, timeout=180)
    assert done.suspend_count == 1, done.history
    states = [e.state for e in done.history]
    assert ChainState.SUSPENDING in states and ChainState.SUSPENDED in states
    suspended = next(e for e in done.history if e.state is ChainState.SUSPENDED)
    assert "acknowledged" in suspended.reason, suspended.reason
    return c.log(low.id)


def _same_weights(final: Path, reference: Path) -> None:
    got, want = torch.load(final), torch.load(reference)
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key


def _check(tmp_path: Path, script: str, convert: list[str], args: list[str], started: str, resumed: str) -> None:
    """Reference run, then the same on a cluster with a preemption: same weights, resumed as said."""
    ref_work, work, ref_data = tmp_path / "ref", tmp_path / "work", tmp_path / "ref-data"
    ref_work.mkdir()
    work.mkdir()
    kind, source, *options = convert
    _convert(kind, source, str(ref_data), *options)
    _reference(script, [*args, "--out", "reference.pt"], ref_work, ref_data)
    with Cluster(tmp_path / "cluster", nodes=1) as c:
        _convert(kind, source, str(c.config.storage.dataset_root), *options)
        log = _preempt_and_resume(c, script, [*args, "--step-time", "0.1", "--out", "final.pt"], work, started)
    assert resumed in log
    _same_weights(work / "final.pt", ref_work / "reference.pt")


def test_resnet_over_imagenet_with_haiscale_ddp_and_bind_numa_resumes_to_the_same_weights(tmp_path):
    source = _imagenet_source(tmp_path / "imagenet-src")
    _check(tmp_path, str(JOBS / "hfai_resnet.py"), ["imagenet", str(source), "--nfiles", "2"],
           ["--epochs", "3", "--batch-size", "4"], started="Epoch: 0, Step: 3,", resumed="resumed from epoch")


def test_bert_mlm_over_clue_with_hfai_ddp_resumes_to_the_same_weights(tmp_path):
    corpus = _corpus_source(tmp_path / "corpus.txt")
    _check(tmp_path, str(JOBS / "hfai_bert_mlm.py"),
           ["clue-corpus", str(corpus), "--vocab-size", "64", "--max-length", "24"],
           ["--epochs", "2", "--batch-size", "4"], started="Epoch: 0/2, Step: 3/", resumed="Load from epoch 0, step")
