"""ResNet-style ImageNet training written as HFAiLab's public hfai-models scripts are (resnet/train.py).

The calls are theirs: ``hfai.datasets.ImageNet`` with its ``loader(sampler=DistributedSampler)`` and
``set_step``, ``haiscale.ddp``, ``hfai.checkpoint.init`` and ``model.try_save`` each step,
``hfai.multiprocessing.spawn(..., bind_numa=True)``, ``set_nccl_opt_level``. What differs is only
what a CPU machine needs (gloo instead of NCCL, no ``.cuda()``, a worker count instead of
``torch.cuda.device_count()``) and a tiny model, so that the test suite can preempt it, resume it
and compare its final weights with an uninterrupted run.

    python hfai_resnet.py --epochs 3 --save-path output/resnet --out final.pt
"""

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
from haiscale.ddp import DistributedDataParallel
from torch import nn
from torch.optim import SGD
from torch.optim.lr_scheduler import StepLR
from torch.utils.data.distributed import DistributedSampler

import hfai
import hfai.distributed as dist

dist.set_nccl_opt_level(dist.HFAI_NCCL_OPT_LEVEL.AUTO)

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--nprocs", type=int, default=2, help="workers per node (the GPUs of a real node)")
parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step, to look like work")
parser.add_argument("--save-path", default="output/resnet")
parser.add_argument("--out", default=None, help="rank 0 writes the final weights here")
args = parser.parse_args()

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def to_tensor(img):
    """ToTensor + Normalize without torchvision (whose PyPI wheel pairs with CUDA torch only)."""
    array = (np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0 - MEAN) / STD
    return torch.from_numpy(array.transpose(2, 0, 1).copy())


class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))


def resnet_tiny(num_classes):
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        Block(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes),
    )


def train(dataloader, model, criterion, optimizer, epoch, local_rank, start_step, best_acc):
    model.train()
    for step, batch in enumerate(dataloader):
        step += start_step
        samples, labels = batch
        outputs = model(samples)
        optimizer.zero_grad()
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()
        if local_rank == 0:
            print(f"Epoch: {epoch}, Step: {step}, Loss: {loss.item()}", flush=True)
        time.sleep(args.step_time)
        model.try_save(epoch, step + 1, others=best_acc)


def validate(dataloader, model, criterion, epoch, local_rank):
    loss, correct1, total = torch.zeros(3)
    model.eval()
    with torch.no_grad():
        for samples, labels in dataloader:
            outputs = model(samples)
            loss += criterion(outputs, labels)
            correct1 += torch.eq(outputs.argmax(-1), labels).sum()
            total += samples.size(0)
    for x in [loss, correct1, total]:
        dist.reduce(x, 0)
    if local_rank == 0:
        print(f"Epoch: {epoch}, Acc1: {100 * correct1.item() / total.item():.2f}%", flush=True)
    return correct1.item() / total.item()


def main(local_rank):
    torch.set_num_threads(1)  # the same arithmetic order in every run: bit-identical weights
    Path(args.save_path).mkdir(exist_ok=True, parents=True)

    ip = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("MASTER_PORT", "29512")
    hosts = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    gpus = args.nprocs
    dist.init_process_group(backend="gloo", init_method=f"tcp://{ip}:{port}", world_size=hosts * gpus,
                            rank=rank * gpus + local_rank)

    torch.manual_seed(0)
    train_dataset = hfai.datasets.ImageNet("train", transform=to_tensor)
    model = resnet_tiny(num_classes=4)
    model = hfai.nn.to_hfai(model)
    model = DistributedDataParallel(model)

    train_datasampler = DistributedSampler(train_dataset)
    train_dataloader = train_dataset.loader(args.batch_size, sampler=train_datasampler, num_workers=0)
    val_dataset = hfai.datasets.ImageNet("val", transform=to_tensor)
    val_datasampler = DistributedSampler(val_dataset)
    val_dataloader = val_dataset.loader(args.batch_size, sampler=val_datasampler, num_workers=0)

    criterion = nn.CrossEntropyLoss()
    optimizer = SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    scheduler = StepLR(optimizer, step_size=2, gamma=0.5)

    ckpt_path = os.path.join(args.save_path, "latest.pt")
    start_epoch, start_step, best_acc = hfai.checkpoint.init(model, optimizer, scheduler=scheduler,
                                                             ckpt_path=ckpt_path)
    best_acc = best_acc or 0
    if start_epoch or start_step:
        print(f"[rank {rank * gpus + local_rank}] resumed from epoch {start_epoch} step {start_step}", flush=True)

    for epoch in range(start_epoch, args.epochs):
        train_datasampler.set_epoch(epoch)
        train_dataloader.set_step(start_step)
        train(train_dataloader, model, criterion, optimizer, epoch, local_rank, start_step, best_acc)
        start_step = 0
        scheduler.step()
        acc = validate(val_dataloader, model, criterion, epoch, local_rank)
        best_acc = max(best_acc, acc)

    if args.out and rank == 0 and local_rank == 0:
        torch.save(model.module.state_dict(), args.out)
        print("training finished", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    hfai.multiprocessing.spawn(main, args=(), nprocs=args.nprocs, bind_numa=True)
