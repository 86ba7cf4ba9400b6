"""Checkpoints: atomic single files, and the original hfai client's form written by every rank.

Two forms share ``save`` and ``load``:

* ``save(obj, path, saver=None)`` / ``load(path, loader=None)``: one file (``torch.save`` unless
  ``saver`` is given). In a distributed job only one rank should call it.
* ``save(fname, model, optimizer=None, others=None, group=None)`` /
  ``load(fname, nthreads=8, **torch_load_kw)``: the original client's API, which scripts derived
  from hfai-models call. ``save`` is called on every rank of an initialised process group (or in a
  plain process); each rank writes its share of the model's and the optimizer's state, so a large
  checkpoint is written in parallel, and ``fname`` becomes a directory of parts. Every rank must
  hold the same state (data parallel), and all must write to one file system. ``load`` reads the
  parts with ``nthreads`` threads and returns ``{"model": ..., "optimizer": ..., **others}``.
  Parameters and optimizer state must be equal on every rank (checked by a hash of every
  tensor: a save whose ranks differ is refused); a module's buffers (BatchNorm's running
  statistics, which ranks may hold differently) are all taken from rank 0, never mixed.
* ``init(model, optimizer, scheduler=None, amp_scaler=None, ckpt_path=...)`` and the
  ``model.try_save(epoch, step, others)`` it attaches: automatic resume (:mod:`hfai.auto_resume`).

Every write is atomic: a job killed in the middle of a save leaves the previous checkpoint
readable. A single file is written to a temporary name, fsynced and renamed. A directory commits
with one rename of ``fname/manifest.json``, which names the parts of that save; parts of older or
unfinished saves are removed after the commit. Files get the mode a plain ``open()`` would give
them (0666 less the user's umask), directories 0777 less the umask.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hfai.auto_resume import CheckpointLoadError, init
from hfai.protocol.errors import HfaiError

__all__ = ["CheckpointLoadError", "atomic_path", "init", "latest", "load", "load_file", "load_sharded", "save",
           "save_file", "save_sharded"]

_STEP = re.compile(r"(\d+)")

#: In a directory checkpoint: names the parts of the last finished save (the commit point).
MANIFEST = "manifest.json"
FORMAT = "hfai.checkpoint"
VERSION = 1
# A part, or the temporary file of one; group 1 is the save's generation token.
_PART = re.compile(r"^\.?part-([0-9a-f]+)-\d+-of-\d+\.pt")
_RESERVED = ("model", "optimizer")


# ------------------------------------------------------------------------------ atomic files

def _create_temp(directory: Path, stem: str) -> Path:
    """A new empty file next to the final one. Created with mode 0666 so the umask applies, as
    for any file the job writes (mkstemp's 0600 stuck to every checkpoint after the rename)."""
    for _ in range(100):
        tmp = directory / f".{stem}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"cannot create a temporary file in {directory}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it is fsynced and renamed onto ``path``."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_temp(final.parent, final.name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def save_file(obj: Any, path: str | os.PathLike, saver: Callable[[Any, str], None] | None = None) -> Path:
    """Save ``obj`` atomically to the one file ``path`` (with ``torch.save`` unless ``saver`` is given)."""
    if saver is None:
        import torch

        saver = torch.save
    with atomic_path(path) as tmp:
        saver(obj, str(tmp))
    return Path(path)


def load_file(path: str | os.PathLike, loader: Callable[[str], Any] | None = None, **torch_load_kw) -> Any:
    """Read one checkpoint file (``torch.load`` onto the CPU unless ``loader`` is given)."""
    if loader is not None:
        return loader(str(path))
    import torch

    return torch.load(str(path), **{"map_location": "cpu", "weights_only": False, **torch_load_kw})


# ------------------------------------------------------------------------------ both forms

def save(fname: Any, model: Any = None, optimizer: Any = None, others: Mapping[str, Any] | None = None,
         group: Any = None, *, saver: Callable[[Any, str], None] | None = None,
         path: str | os.PathLike | None = None) -> Path:
    """``save(fname, model, optimizer=None, others=None, group=None)``: the original client's
    form, on every rank (see the module doc); or ``save(obj, path, saver=None)``: one file.

    The single-file form is recognised by its second argument being a path."""
    if path is not None or isinstance(model, (str, os.PathLike)):
        target = path if path is not None else model
        if callable(optimizer) and saver is None:  # save(obj, path, saver) positionally
            saver, optimizer = optimizer, None
        if optimizer is not None or others is not None or group is not None:
            raise HfaiError("save(obj, path) writes one file: optimizer, others and group belong to "
                            "save(fname, model, optimizer, others, group)")
        return save_file(fname, target, saver)
    if model is None:
        raise HfaiError("save needs a model (save(fname, model, ...)) or a path (save(obj, path))")
    return save_sharded(fname, model, optimizer, others, group)


def load(fname: str | os.PathLike, nthreads: int = 8, loader: Callable[[str], Any] | None = None,
         **torch_load_kw) -> Any:
    """A checkpoint ``save`` wrote: a directory of parts gives ``{"model": ..., "optimizer": ...,
    **others}`` (parts read by ``nthreads`` threads), a single file what was saved in it.
    ``torch_load_kw`` go to ``torch.load`` (default ``map_location="cpu"``, ``weights_only=False``:
    a checkpoint is the job's own file); ``loader(path)`` replaces ``torch.load``."""
    p = Path(fname)
    if p.is_dir():
        return load_sharded(p, nthreads, loader, **torch_load_kw)
    return load_file(p, loader, **torch_load_kw)


def latest(directory: str | os.PathLike, pattern: str = "*.pt") -> Path | None:
    """The checkpoint in ``directory`` (a file, or a finished directory of parts) with the highest
    number in its name, then the newest."""
    d = Path(directory)
    if not d.is_dir():
        return None
    candidates = [p for p in d.glob(pattern)
                  if not p.name.startswith(".") and (p.is_file() or (p / MANIFEST).is_file())]
    if not candidates:
        return None

    def order(p: Path) -> tuple[int, float]:
        numbers = _STEP.findall(p.stem)
        return (int(numbers[-1]) if numbers else -1, p.stat().st_mtime)

    return max(candidates, key=order)


# ------------------------------------------------------------------------- the directory form

def save_sharded(fname: str | os.PathLike, model: Any, optimizer: Any = None,
                 others: Mapping[str, Any] | None = None, group: Any = None) -> Path:
    """Write ``fname/`` as a directory of parts, one per rank of ``group`` (default: the default
    process group, or this process alone). Every rank must call it, with the same state.

    Raises HfaiError on every rank when any rank could not write its part (or rank 0 could not
    commit): the previous checkpoint under ``fname`` is then still the one ``load`` reads."""
    import torch

    rank, world = _rank_world(group)
    target = Path(fname)
    models, model_list = _states(model, "model")
    optims, optim_list = _states(optimizer, "optimizer") if optimizer is not None else ([], False)
    others = dict(others or {})
    clash = [k for k in others if k in _RESERVED or not isinstance(k, str)]
    if clash:
        raise HfaiError(f"others may not use the keys {clash!r}: load returns them beside 'model' and 'optimizer'")
    entries = _entries(models, optims, _buffer_keys(model))
    token = secrets.token_hex(6)
    if world > 1:
        # Every rank must make the same plan from the same state, or the parts would not add up.
        plans = _gather((_digest(entries), token, _fingerprints(models, optims, entries)), group, world)
        if any(d != plans[0][0] for d, _, _ in plans):
            raise HfaiError("hfai.checkpoint.save: the ranks hold different model or optimizer state (it "
                            "saves a data-parallel job, whose ranks hold the same); use save(obj, path) on one rank")
        _check_same_values(entries, [f for _, _, f in plans])
        token = plans[0][1]
    mine = _share(entries, world)[rank]
    name = _part_name(token, rank, world)
    error: str | None = None
    cause: BaseException | None = None
    try:
        if target.exists() and not target.is_dir():
            raise FileExistsError(f"{target} is a file, not a checkpoint directory (remove it or save elsewhere)")
        target.mkdir(parents=True, exist_ok=True)
        part = _part(models, optims, mine, rank, world)
        if rank == 0:
            part["meta"] = _meta(models, model_list, optims, optim_list, optimizer is None, others)
        with atomic_path(target / name) as tmp:
            torch.save(part, str(tmp))
    except Exception as e:  # reported to every rank below, so none waits for the others in vain
        error, cause = f"rank {rank}: {type(e).__name__}: {e}", e
    errors = [e for e in (_gather(error, group, world) if world > 1 else [error]) if e]
    commit_error = None
    if rank == 0:
        try:
            if errors:
                _discard(target, lambda t: t == token)
            else:
                _commit(target, token, world)
        except Exception as e:
            commit_error, cause = f"rank 0: {type(e).__name__}: {e}", e
    if world > 1:
        commit_error = _gather(commit_error, group, world)[0]
    problems = errors or ([commit_error] if commit_error else [])
    if problems:
        raise HfaiError(f"checkpoint {target} not saved ({'; '.join(problems)}); the previous one is kept") from cause
    return target


def load_sharded(fname: str | os.PathLike, nthreads: int = 8, loader: Callable[[str], Any] | None = None,
                 **torch_load_kw) -> dict[str, Any]:
    """Read a directory checkpoint's parts in parallel and put model, optimizer and others back together."""
    from concurrent.futures import ThreadPoolExecutor

    d = Path(fname)
    for attempt in range(3):
        manifest_path = d / MANIFEST
        try:
            manifest = json.loads(manifest_path.read_text())
        except FileNotFoundError:
            raise HfaiError(f"{d} holds no finished checkpoint (no {MANIFEST})") from None
        except ValueError as e:
            raise HfaiError(f"{manifest_path} is not a checkpoint manifest: {e}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not manifest.get("parts"):
            raise HfaiError(f"{manifest_path} is not a checkpoint manifest")
        if int(manifest.get("version", 0)) > VERSION:
            raise HfaiError(f"{d} was saved by a newer hfai (checkpoint version {manifest['version']})")
        parts = [d / str(p) for p in manifest["parts"]]
        try:
            with ThreadPoolExecutor(max_workers=max(1, min(int(nthreads), len(parts)))) as pool:
                loaded = list(pool.map(lambda p: load_file(p, loader, **torch_load_kw), parts))
            break
        except FileNotFoundError:
            # A newer save committed meanwhile and removed these parts: read its manifest.
            if attempt == 2:
                raise
    return _merge(loaded)


def _rank_world(group: Any) -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    if group is not None:
        raise HfaiError("a group was given but no process group is initialised")
    return 0, 1


def _gather(obj: Any, group: Any, world: int) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj, group=group)
    return out


def _states(obj: Any, what: str) -> tuple[list[Mapping], bool]:
    """The state dicts of a module or optimizer (or a state dict, or a list of either)."""
    many = isinstance(obj, (list, tuple))
    out = []
    for x in obj if many else [obj]:
        if callable(getattr(x, "state_dict", None)):
            out.append(x.state_dict())
        elif isinstance(x, Mapping):
            out.append(x)
        else:
            raise HfaiError(f"{what} must be a torch {'module' if what == 'model' else 'optimizer'}, "
                            f"a state dict, or a list of them, not {type(x).__name__}")
    return out, many


def _nbytes(value: Any) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, Mapping):  # an optimizer's per-parameter state
        return sum(_nbytes(v) for v in value.values())
    return 64


def _optim_state(sd: Mapping) -> Mapping:
    state = sd.get("state")
    return state if isinstance(state, Mapping) else {}


def _buffer_keys(model: Any) -> list[frozenset[str] | None]:
    """Per model: the state-dict keys that are not parameters (BatchNorm's running statistics and
    the like), or None for a plain state dict, whose parameters cannot be told apart."""
    out: list[frozenset[str] | None] = []
    for m in model if isinstance(model, (list, tuple)) else [model]:
        named = getattr(m, "named_parameters", None)
        if not callable(named) or not callable(getattr(m, "state_dict", None)):
            out.append(None)
            continue
        params = {name for name, _ in named(remove_duplicate=False)}
        out.append(frozenset(k for k in m.state_dict(keep_vars=True) if k not in params))
    return out


#: An entry: (section, index, key, bytes, from rank 0 only). Rank 0's only: a module's buffers,
#: which data-parallel ranks may legitimately hold differently (BatchNorm statistics of their own
#: batches): the checkpoint takes one rank's, whole, never a mix.
Entry = tuple[str, int, Any, int, bool]


def _entries(models: list[Mapping], optims: list[Mapping], buffers: list[frozenset[str] | None]) -> list[Entry]:
    """What the ranks share out: every model entry and every parameter's optimizer state, in
    state-dict order."""
    out: list[Entry] = []
    for i, sd in enumerate(models):
        bufs = buffers[i] if i < len(buffers) else None
        out += [("model", i, k, _nbytes(v), bufs is not None and k in bufs) for k, v in sd.items()]
    out += [("optimizer", i, k, _nbytes(v), False) for i, sd in enumerate(optims) for k, v in _optim_state(sd).items()]
    return out


def _value(models: list[Mapping], optims: list[Mapping], entry: Entry) -> Any:
    section, i, key = entry[:3]
    return models[i][key] if section == "model" else _optim_state(optims[i])[key]


def _fingerprints(models: list[Mapping], optims: list[Mapping], entries: list[Entry]) -> list[str | None]:
    """A hash of the value of every entry all ranks must hold alike (None for rank 0's only)."""
    return [None if e[4] else _fingerprint(_value(models, optims, e)) for e in entries]


def _fingerprint(value: Any) -> str:
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    _feed(h, value)
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach()
        h.update(f"{t.dtype} {tuple(t.shape)};".encode())
        if t.numel() == 0:
            return
        try:
            flat = t.cpu().contiguous().reshape(-1)
            h.update(flat.view(torch.uint8).numpy().data)  # no copy of the bytes
        except (RuntimeError, TypeError):  # sparse, quantized, ...: slower, but still the values
            h.update(repr(t.cpu().to_dense().tolist() if t.is_sparse else t.tolist()).encode())
    elif isinstance(value, Mapping):
        for k in sorted(value, key=repr):
            h.update(f"{k!r}:".encode())
            _feed(h, value[k])
    else:
        h.update(f"{type(value).__name__}:{value!r};".encode())


def _check_same_values(entries: list[Entry], per_rank: list[list[str | None]]) -> None:
    """Refuse a save whose ranks hold different parameters or optimizer state: its parts would
    mix ranks, and the checkpoint would hold a state no rank had."""
    differ = [j for j in range(len(entries)) if len({f[j] for f in per_rank}) > 1]
    if not differ:
        return
    names = ", ".join(f"{entries[j][0]}[{entries[j][1]}][{entries[j][2]!r}]" for j in differ[:5])
    names += " ..." if len(differ) > 5 else ""
    ranks = sorted({r for r, f in enumerate(per_rank) for j in differ if f[j] != per_rank[0][j]})
    raise HfaiError(f"hfai.checkpoint.save: ranks {ranks} hold other values than rank 0 for {len(differ)} "
                    f"parameter or optimizer entries ({names}); a data-parallel job's ranks hold the same (are "
                    f"the gradients all-reduced? is the model wrapped in DistributedDataParallel?). To save one "
                    f"rank's state, call save(obj, path) on that rank only")


def _digest(entries: list[Entry]) -> str:
    import hashlib

    return hashlib.sha256(repr(entries).encode()).hexdigest()


def _share(entries: list[Entry], world: int) -> list[set[tuple[str, int, Any]]]:
    """Entries per rank: rank 0's only ones to rank 0, the rest for about equal bytes each
    (largest first, to the least loaded rank; ties to the lower rank). Pure and deterministic:
    every rank computes the same shares."""
    shares: list[set[tuple[str, int, Any]]] = [set() for _ in range(world)]
    pinned = [e for e in entries if e[4]]
    shares[0].update(e[:3] for e in pinned)
    load = [(sum(e[3] for e in pinned) if r == 0 else 0, r) for r in range(world)]
    heapq.heapify(load)
    order = sorted((i for i, e in enumerate(entries) if not e[4]), key=lambda i: (-entries[i][3], i))
    for i in order:
        size, r = heapq.heappop(load)
        section, index, key, nbytes, _ = entries[i]
        shares[r].add((section, index, key))
        heapq.heappush(load, (size + nbytes, r))
    return shares


def _part_name(token: str, rank: int, world: int) -> str:
    return f"part-{token}-{rank:05d}-of-{world:05d}.pt"


def _part(models: list[Mapping], optims: list[Mapping], mine: set, rank: int, world: int) -> dict[str, Any]:
    return {
        "version": VERSION, "rank": rank, "world": world,
        "model": [{k: v for k, v in sd.items() if ("model", i, k) in mine} for i, sd in enumerate(models)],
        "optimizer": [{k: v for k, v in _optim_state(sd).items() if ("optimizer", i, k) in mine}
                      for i, sd in enumerate(optims)],
    }


def _meta(models: list[Mapping], model_list: bool, optims: list[Mapping], optim_list: bool, no_optim: bool,
          others: dict[str, Any]) -> dict[str, Any]:
    """What only rank 0 writes: key orders, the optimizers' parameter groups, others."""
    return {
        "model_keys": [list(sd.keys()) for sd in models],
        # load_state_dict reads per-module versions from it (BatchNorm, ...): keep it.
        "model_metadata": [getattr(sd, "_metadata", None) for sd in models],
        "model_list": model_list,
        "optimizer_state_keys": [list(_optim_state(sd).keys()) for sd in optims],
        "optimizer_rest": [{k: v for k, v in sd.items() if k != "state"} for sd in optims],
        "optimizer_has_state": [isinstance(sd.get("state"), Mapping) for sd in optims],
        "optimizer_list": optim_list,
        "optimizer_none": no_optim,
        "others": others,
    }


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    from collections import OrderedDict

    meta = next((p["meta"] for p in parts if p.get("rank") == 0 and "meta" in p), None)
    if meta is None:
        raise HfaiError("the checkpoint has no part of rank 0")
    flat_model: dict[tuple[int, Any], Any] = {}
    flat_optim: dict[tuple[int, Any], Any] = {}
    for p in parts:
        for i, d in enumerate(p["model"]):
            flat_model.update(((i, k), v) for k, v in d.items())
        for i, d in enumerate(p["optimizer"]):
            flat_optim.update(((i, k), v) for k, v in d.items())
    models = []
    for i, keys in enumerate(meta["model_keys"]):
        sd = OrderedDict((k, flat_model[(i, k)]) for k in keys)
        if meta["model_metadata"][i] is not None:
            sd._metadata = meta["model_metadata"][i]  # type: ignore[attr-defined]
        models.append(sd)
    optims = []
    for i, keys in enumerate(meta["optimizer_state_keys"]):
        rest = meta["optimizer_rest"][i]
        if meta["optimizer_has_state"][i]:
            optims.append({"state": {k: flat_optim[(i, k)] for k in keys}, **rest})
        else:
            optims.append(dict(rest))
    out: dict[str, Any] = {
        "model": models if meta["model_list"] else models[0],
        "optimizer": None if meta["optimizer_none"] else (optims if meta["optimizer_list"] else optims[0]),
    }
    out.update(meta["others"])
    return out


def _commit(target: Path, token: str, world: int) -> None:
    """Make the save of generation ``token`` the checkpoint: one atomic rename of the manifest."""
    parts = [_part_name(token, r, world) for r in range(world)]
    missing = [r for r, name in enumerate(parts) if not (target / name).is_file()]
    if missing:
        raise FileNotFoundError(f"the parts of ranks {missing} are not in {target}: every rank must "
                                f"write to the same (shared) file system")
    _fsync_dir(target)  # the parts' names are durable before the manifest names them
    manifest = {"format": FORMAT, "version": VERSION, "generation": token, "world": world, "parts": parts,
                "saved_ts": time.time()}
    with atomic_path(target / MANIFEST) as tmp:
        tmp.write_text(json.dumps(manifest, indent=1))
    _discard(target, lambda t: t != token)


def _discard(target: Path, which: Callable[[str], bool]) -> None:
    """Remove the parts (and leftover temporary files) of the generations ``which`` selects."""
    for entry in os.scandir(target):
        m = _PART.match(entry.name)
        if m and which(m.group(1)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
