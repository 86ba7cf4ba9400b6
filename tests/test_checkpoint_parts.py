"""hfai.checkpoint's original-client form (issue 13 defect 15): save(fname, model, optimizer, others,
group) on every rank writes a directory of parts, one per rank; load(fname, nthreads, **kw) puts
them back together. Two gloo processes on CPU, and a plain process; today's single-file helpers
beside it; every write atomic; files created with the user's umask."""

from __future__ import annotations

import os
import stat

import pytest

torch = pytest.importorskip("torch")

import hfai.checkpoint as ckpt  # noqa: E402
from hfai.protocol.errors import HfaiError  # noqa: E402


def _trained(seed: int = 0):
    """A small model with parameters and buffers of several sizes, and an optimizer with state."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(8, 16)).square().mean().backward()
        opt.step()
    return model, opt


def _same(a, b) -> bool:
    """Deep equality of state dicts (tensors by value)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _parts(d) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("part-"))


@pytest.mark.slow
def test_a_plain_process_saves_a_directory_and_loads_it_back(tmp_path):
    model, opt = _trained()
    out = tmp_path / "latest.pt"
    assert ckpt.save(str(out), model, opt, others={"epoch": 3, "step": 7}) == out
    assert out.is_dir() and (out / ckpt.MANIFEST).is_file() and len(_parts(out)) == 1
    got = ckpt.load(str(out), nthreads=4, map_location="cpu")
    assert set(got) == {"model", "optimizer", "epoch", "step"} and (got["epoch"], got["step"]) == (3, 7)
    assert _same(got["model"], model.state_dict()) and _same(got["optimizer"], opt.state_dict())
    fresh, fresh_opt = _trained(seed=1)
    fresh.load_state_dict(got["model"])
    fresh_opt.load_state_dict(got["optimizer"])
    x = torch.randn(5, 16)
    model.eval(), fresh.eval()
    assert torch.equal(model(x), fresh(x))
    assert _same(fresh_opt.state_dict(), opt.state_dict())
    # Without an optimizer, and lists of models: the shape given is the shape returned.
    ckpt.save(out, [model, fresh])
    again = ckpt.load(out)
    assert again["optimizer"] is None and len(again["model"]) == 2 and _same(again["model"][1], fresh.state_dict())
    assert _parts(out) == _parts(out)[:1]  # the older save's part is gone


@pytest.mark.slow  # a fresh interpreter or more: seconds
def test_todays_single_file_helpers_still_work(tmp_path):
    model, _ = _trained()
    path = ckpt.save({"model": model.state_dict(), "step": 4}, tmp_path / "one.pt")
    assert path.is_file() and ckpt.load(path)["step"] == 4
    assert ckpt.load(str(path), map_location="cpu")["step"] == 4
    assert ckpt.save_file({"a": 1}, tmp_path / "two.pt") == tmp_path / "two.pt"
    assert ckpt.load_file(tmp_path / "two.pt") == {"a": 1}
    with pytest.raises(HfaiError, match="one file"):
        ckpt.save({"a": 1}, tmp_path / "three.pt", others={"x": 1})
    with pytest.raises(HfaiError, match="reserved|may not use"):
        ckpt.save(tmp_path / "d", model, others={"model": 1})
    (tmp_path / "empty").mkdir()
    with pytest.raises(HfaiError, match="no finished checkpoint"):
        ckpt.load(tmp_path / "empty")
    with pytest.raises(HfaiError, match="is a file"):
        ckpt.save(tmp_path / "one.pt", model)
    assert ckpt.load(path)["step"] == 4  # the refused save left it alone


def test_latest_finds_directory_checkpoints_too(tmp_path):
    model, _ = _trained()
    ckpt.save(tmp_path / "ckpt_2.pt", model)
    ckpt.save({"a": 1}, tmp_path / "ckpt_1.pt")
    (tmp_path / "ckpt_9.pt").mkdir()  # an unfinished directory: no manifest
    assert ckpt.latest(tmp_path) == tmp_path / "ckpt_2.pt"


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path):
    model, opt = _trained()
    out = tmp_path / "ck"
    ckpt.save(out, model, opt, others={"step": 1})
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(HfaiError, match="not saved"):
        ckpt.save(out, model, opt, others={"step": 2, "fn": lambda: 0})  # a lambda cannot be pickled
    assert sorted(p.name for p in out.iterdir()) == before  # no part or temporary file left behind
    assert ckpt.load(out)["step"] == 1


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_get_the_users_umask(tmp_path, umask, mode):
    model, _ = _trained()
    old = os.umask(umask)
    try:
        one = ckpt.save({"a": 1}, tmp_path / "one.pt")
        parts = ckpt.save(tmp_path / "parts", model)
    finally:
        os.umask(old)
    files = [one, parts / ckpt.MANIFEST, *(parts / n for n in _parts(parts))]
    assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {mode}
    assert stat.S_IMODE(parts.stat().st_mode) == 0o777 & ~umask


# ------------------------------------------------------------------------- two gloo ranks

def _rank(rank: int, store: str, out: str, results: str) -> None:
    import datetime
    import gc

    import torch.distributed as dist

    import hfai.checkpoint

    # A file store: no port to pick that another test could take meanwhile.
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    model, opt = _trained()  # the same state on both ranks, as under DistributedDataParallel
    hfai.checkpoint.save(out, model, opt, others={"epoch": 5})
    # Every rank may read it as soon as save returned on it.
    got = hfai.checkpoint.load(out, nthreads=2)
    ok = _same(got["model"], model.state_dict()) and _same(got["optimizer"], opt.state_dict()) and got["epoch"] == 5
    # Rank 0 cannot write its part (others holds a lambda): both ranks hear it, none hangs.
    try:
        hfai.checkpoint.save(out, model, opt, others={"epoch": 6, "fn": lambda: 0})
        failed = "saved"
    except HfaiError as e:
        failed = "rank 0" in str(e) and "not saved" in str(e)
    # Different state on the ranks is refused on both, before anything is written.
    try:
        hfai.checkpoint.save(out, torch.nn.Linear(2, 2 + rank))
        mismatch = "saved"
    except HfaiError as e:
        mismatch = "different" in str(e)
    with open(os.path.join(results, f"rank{rank}"), "w") as f:
        f.write(f"{ok} {failed} {mismatch}")
    # Tear down together, with nothing of the failed saves left for the collector: twice in full
    # suite runs (never alone, nor under CPU load) rank 0 aborted at exit in gloo's C++ teardown
    # ("terminate called without an active exception") after writing its results.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_each_write_their_share(tmp_path):
    import hfai.multiprocessing

    out = tmp_path / "latest.pt"
    hfai.multiprocessing.spawn(_rank, args=(str(tmp_path / "store"), str(out), str(tmp_path)), nprocs=2)
    assert (tmp_path / "rank0").read_text() == "True True True"
    assert (tmp_path / "rank1").read_text() == "True True True"
    names = _parts(out)
    assert len(names) == 2 and names[0].endswith("00000-of-00002.pt") and names[1].endswith("00001-of-00002.pt")
    # Each rank wrote tensors of its own (model and optimizer state): about half of the bytes each.
    shares = [torch.load(out / n, weights_only=False) for n in names]
    sizes = [sum(ckpt._nbytes(v) for section in ("model", "optimizer") for d in p[section] for v in d.values())
             for p in shares]
    assert min(sizes) > 0.4 * sum(sizes)
    assert "meta" in shares[0] and "meta" not in shares[1]
    model, opt = _trained()
    got = ckpt.load(out)
    assert got["epoch"] == 5 and _same(got["model"], model.state_dict()) and _same(got["optimizer"], opt.state_dict())
