"""BERT-style masked-LM pretraining written as HFAiLab's public hfai-models script is (bert/pretrain.py).

The calls are theirs: ``hfai.datasets.CLUEForMLM()`` and its ``loader(sampler=DistributedSampler)``
with ``set_step``, ``hfai.nn.to_hfai(model, verbose=True)``, the hfreduce DDP
(``hfai.nn.parallel.DistributedDataParallel``), rank 0 checking ``hfai.client.receive_suspend_command()``
every step, saving and calling ``hfai.client.go_suspend()``, ``torch.multiprocessing.spawn``. What
differs is what a CPU machine needs (gloo, no ``.cuda()``, a worker count instead of
``torch.cuda.device_count()``) and a tiny model without dropout, so that an interrupted run can be
compared bit for bit with an uninterrupted one.

    python hfai_bert_mlm.py --epochs 2 --save-path output/bert --out final.pt
"""

import argparse
import os
import time
from collections import OrderedDict

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DistributedSampler

import hfai
import hfai.distributed as dist
from hfai.nn.parallel import DistributedDataParallel as HfaiDDP

parser = argparse.ArgumentParser(description="Pretrain BERT")
parser.add_argument("--ddp", type=str, default="hfai", choices=["torch", "hfai"])
parser.add_argument("--no_to_hfai", action="store_true")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--nprocs", type=int, default=2, help="workers per node (the GPUs of a real node)")
parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step, to look like work")
parser.add_argument("--save-path", default="output/bert")
parser.add_argument("--out", default=None, help="rank 0 writes the final weights here")
args = parser.parse_args()


class BertForMLM(nn.Module):
    def __init__(self, vocab_size, hidden_size=32, feedforward_size=64, max_length=128, attn_heads=4, layers=2):
        super().__init__()
        self.token = nn.Embedding(vocab_size, hidden_size, padding_idx=0)
        self.position = nn.Embedding(max_length, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=1e-12)
        layer = nn.TransformerEncoderLayer(hidden_size, attn_heads, feedforward_size, 0.0, "gelu")
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.mlm = nn.Sequential(OrderedDict([
            ("fc1", nn.Linear(hidden_size, hidden_size)),
            ("gelu", nn.GELU()),
            ("norm", nn.LayerNorm(hidden_size, eps=1e-12)),
            ("fc2", nn.Linear(hidden_size, vocab_size)),
        ]))

    def forward(self, seq, mask):
        seq = seq.T  # (seq, batch)
        pos = torch.arange(seq.size(0), dtype=torch.long).unsqueeze(1)
        embed = self.norm(self.token(seq) + self.position(pos))
        encode = self.encoder(embed, src_key_padding_mask=~mask)
        return self.mlm(encode.transpose(0, 1).contiguous())


class Trainer:
    def __init__(self, model, lr, warmup, batch_size, epochs, vocab_size, save_path):
        self.steps = 1
        self.model = model
        self.batch_size = batch_size
        self.vocab_size = vocab_size
        self.epochs = epochs
        self.save_path = save_path
        os.makedirs(save_path, exist_ok=True)
        self.start_step = 0
        self.start_epoch = 0
        self.criterion = torch.nn.CrossEntropyLoss()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr)
        self.scheduler = LambdaLR(self.optimizer,
                                  lambda epoch: lr * min(pow(self.steps, -0.5), pow(warmup, -1.5) * self.steps))
        self.rank = dist.get_rank()

    def pretrain(self, dataset):
        if os.path.exists(os.path.join(self.save_path, "model.pt")):
            self.load()
        self.model.train()
        datasampler = DistributedSampler(dataset)
        dataloader = dataset.loader(self.batch_size, sampler=datasampler, pin_memory=False)
        for epoch in range(self.start_epoch, self.epochs):
            datasampler.set_epoch(epoch)
            dataloader.set_step(self.start_step)
            for step, batch in enumerate(dataloader):
                step += self.start_step
                seq, mask, label = batch
                self.optimizer.zero_grad()
                output = self.model(seq, mask.bool())
                loss = self.criterion(output.view(-1, self.vocab_size), label.view(-1))
                loss.backward()
                self.optimizer.step()
                if self.rank == 0:
                    print(f"Epoch: {epoch}/{self.epochs}, Step: {step}/{len(dataloader)}, Loss: {loss.item()}",
                          flush=True)
                self.steps += 1
                self.scheduler.step()
                time.sleep(args.step_time)
                if self.rank == 0 and hfai.client.receive_suspend_command():
                    self.save(epoch, step + 1)
                    hfai.client.go_suspend()
            self.start_step = 0
            if self.rank == 0:
                self.save(epoch + 1, 0)

    def load(self):
        state = torch.load(os.path.join(self.save_path, "model.pt"), map_location="cpu")
        self.model.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = state["steps"]
        self.start_step = state["step"]
        self.start_epoch = state["epoch"]
        if dist.get_rank() == 0:
            print(f"Load from epoch {self.start_epoch}, step {self.start_step}", flush=True)

    def save(self, epoch, step):
        state = {
            "model": self.model.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "steps": self.steps,
            "epoch": epoch,
            "step": step,
        }
        # Written to a temporary name and renamed: a kill mid-write never leaves half a checkpoint.
        hfai.checkpoint.save_file(state, os.path.join(self.save_path, "model.pt"))
        if dist.get_rank() == 0:
            print(f"save: epoch {epoch}, step {step}", flush=True)


def pretrain(local_rank):
    torch.set_num_threads(1)  # the same arithmetic order in every run: bit-identical weights
    torch.manual_seed(12)
    ip = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("MASTER_PORT", "29513")
    hosts = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    gpus = args.nprocs
    dist.init_process_group(backend="gloo", init_method=f"tcp://{ip}:{port}", world_size=hosts * gpus,
                            rank=rank * gpus + local_rank)

    dataset = hfai.datasets.CLUEForMLM()
    model = BertForMLM(vocab_size=dataset.vocab_size)
    if not args.no_to_hfai:
        model = hfai.nn.to_hfai(model, verbose=True)
    DDP = HfaiDDP if args.ddp == "hfai" else TorchDDP
    model = DDP(model)

    trainer = Trainer(model, lr=2e-1, warmup=100, batch_size=args.batch_size, epochs=args.epochs,
                      vocab_size=dataset.vocab_size, save_path=args.save_path)
    trainer.pretrain(dataset)
    if args.out and dist.get_rank() == 0:
        torch.save(model.module.state_dict(), args.out)
        print("training finished", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.multiprocessing.spawn(pretrain, args=(), nprocs=args.nprocs)
