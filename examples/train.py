"""A tiny training job that honours the hfai interrupt contract (used by the demo and tests).

Each step trains a small MLP on a batch generated from (seed, step), so the data does not depend
on when the job was interrupted. When the platform asks, rank 0 saves model, optimizer and step
atomically and the job acknowledges with ``hfai.go_suspend()``; on restart it resumes from that
checkpoint. The final weights of an interrupted run are therefore bit-identical to those of an
uninterrupted run with the same seed.

Runs anywhere: ``python examples/train.py`` trains locally; under hfai every node runs it with
``WORLD_SIZE``/``RANK``/``MASTER_ADDR``/``MASTER_PORT`` set and gradients are averaged with gloo.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

import hfai
import hfai.checkpoint


def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt


def batch(seed: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + rank)
    x = torch.randn(64, 16, generator=g)
    y = x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=g)
    return x, y


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--step-time", type=float, default=0.2, help="extra seconds per step, to look like work")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-dir", default=None, help="default: checkpoints/<job name>")
    p.add_argument("--out", default=None, help="write the final weights here (rank 0)")
    p.add_argument("--ignore-suspend", action="store_true", help="misbehave: never acknowledge a suspend")
    args = p.parse_args()

    torch.set_num_threads(1)  # same arithmetic order in every run, for bit-identical results
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    name = os.environ.get("HFAI_JOB_NAME", "local")
    ckpt_dir = args.ckpt_dir or os.path.join("checkpoints", name)
    ckpt_path = os.path.join(ckpt_dir, "latest.pt")

    model, opt = build(args.seed)
    start = 0
    if os.path.exists(ckpt_path):
        state = hfai.checkpoint.load(ckpt_path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        print(f"[rank {rank}] resumed from step {start} (suspend count "
              f"{os.environ.get('HFAI_SUSPEND_COUNT', '0')}, whole-life state {hfai.get_whole_life_state()})",
              flush=True)
    else:
        print(f"[rank {rank}] starting from scratch", flush=True)

    for step in range(start, args.steps):
        if not args.ignore_suspend and hfai.receive_suspend_command(sync=world > 1):
            if rank == 0:
                hfai.checkpoint.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt_path)
                hfai.set_whole_life_state(step)
                print(f"[rank {rank}] suspend requested: checkpoint saved at step {step}", flush=True)
            if world > 1:
                dist.barrier()
            hfai.go_suspend()
        x, y = batch(args.seed, step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if world > 1:
            for prm in model.parameters():
                dist.all_reduce(prm.grad)
                prm.grad /= world
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            print(f"[rank {rank}] step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(args.step_time)

    if rank == 0 and args.out:
        hfai.checkpoint.save(model.state_dict(), args.out)
    print(f"[rank {rank}] done after {args.steps} steps", flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
