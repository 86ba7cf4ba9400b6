"""hfai.nn vs torch.nn: forward+backward medians and the speed ratio, measured in one run.

Shapes are the issue's: LayerNorm(1024) on 64x512x1024; MultiheadAttention(512, 8 heads) batch 16
seq 256, called with need_weights=False and with the default; LSTM(256 -> 512, 2 layers) seq 100
batch 32. Every input requires grad (as inside a model), so neither side can skip a gradient.
torch and hfai run interleaved, repetition by repetition, so machine noise hits both alike.
CPU always; CUDA too when a device is present. Ratio = torch time / hfai time (>1: hfai faster).

    python bench/bench_nn.py [--threads 2] [--repeats 7] [--lstm-cpu-route]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

import hfai.nn
import hfai.nn.lstm

_CPU_ROUTE = "_hfai_cpu_route"  # pseudo call argument: run hfai.nn.lstm's CPU route


def _step(module: torch.nn.Module, inputs: list[torch.Tensor], call: dict) -> Callable[[], None]:
    call = dict(call)
    cpu_route = call.pop(_CPU_ROUTE, False)

    def run() -> None:
        hfai.nn.lstm._ROUTE_CPU = cpu_route and isinstance(module, hfai.nn.LSTM)
        try:
            out = module(*inputs, **call)
            out = out[0] if isinstance(out, tuple) else out
            out.sum().backward()
        finally:
            hfai.nn.lstm._ROUTE_CPU = False

    return run


def _timed(run: Callable[[], None], device: str) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds for one call."""
    if device == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def _compare(torch_run, hfai_run, device: str, repeats: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per side."""
    for _ in range(2):  # warm-up: allocator, kernel compilation, oneDNN primitive caches
        torch_run(), hfai_run()
    samples: dict[str, list[tuple[float, float]]] = {"torch": [], "hfai": []}
    for _ in range(repeats):
        samples["torch"].append(_timed(torch_run, device))
        samples["hfai"].append(_timed(hfai_run, device))
    return {
        side: (statistics.median(w for w, _ in s), statistics.median(c for _, c in s))
        for side, s in samples.items()
    }


class _Seed(torch.autograd.Function):
    """``t.sum()`` whose backward hands ``t`` a stored dense gradient (as a layer's input
    receives one) instead of the broadcast ones of ``sum``, which would take slower paths."""

    @staticmethod
    def forward(ctx, t, grad):  # noqa: D102 (autograd protocol)
        ctx.grad = grad
        return t.sum()

    @staticmethod
    def backward(ctx, _ones):  # noqa: D102 (autograd protocol)
        return ctx.grad, None


class _MhaFloor(torch.nn.Module):
    """The unavoidable work of one MHA forward+backward, each operand a fresh leaf."""

    def __init__(self, mha: torch.nn.MultiheadAttention, x: torch.Tensor):
        super().__init__()
        self.mha, self.x = mha, x
        seq, batch, embed = x.shape
        heads = mha.num_heads
        shape = (batch, heads, seq, embed // heads)
        self.qkv = [torch.randn(shape, device=x.device, requires_grad=True) for _ in range(3)]
        self.attn = torch.randn(x.shape, device=x.device, requires_grad=True)
        self.d_projected = torch.randn(seq, batch, 3 * embed, device=x.device)
        self.d_attended = torch.randn(shape, device=x.device)

    def forward(self, *_call_args, **_call_kwargs) -> torch.Tensor:  # takes torch's MHA call
        F = torch.nn.functional
        m = self.mha
        projected = F.linear(self.x, m.in_proj_weight, m.in_proj_bias)
        attended = F.scaled_dot_product_attention(*self.qkv)
        out = F.linear(self.attn, m.out_proj.weight, m.out_proj.bias)
        # out_proj's gradient is sum's broadcast ones, as in the timed modules' own call.
        return (
            _Seed.apply(projected, self.d_projected)
            + _Seed.apply(attended, self.d_attended)
            + out.sum()
        )


def _cases(device: str, with_cpu_lstm_route: bool):
    """(name, torch module, hfai module with the same weights, inputs, call kwargs)."""

    def pair(cls_torch, cls_hfai, *args):
        torch.manual_seed(0)
        ref = cls_torch(*args).to(device)
        ours = cls_hfai(*args).to(device)
        ours.load_state_dict(ref.state_dict())
        return ref, ours

    def leaf(*shape):
        return torch.randn(shape, device=device, requires_grad=True)

    ln = pair(torch.nn.LayerNorm, hfai.nn.LayerNorm, 1024)
    yield "LayerNorm(1024) 64x512x1024", *ln, [leaf(64, 512, 1024)], {}
    mha = pair(torch.nn.MultiheadAttention, hfai.nn.MultiheadAttention, 512, 8)
    x = leaf(256, 16, 512)
    yield "MHA(512,8) b16 s256 need_weights=False", *mha, [x, x, x], {"need_weights": False}
    yield "MHA(512,8) b16 s256 default (weights)", *mha, [x, x, x], {}
    # Not an implementation: the matrix products and the fused attention kernel that any
    # MultiheadAttention must run (fwd+bwd, contiguous operands, no layout work). torch / this
    # row is the most any rearrangement of the same arithmetic could gain on this machine.
    floor = _MhaFloor(mha[1], x)
    yield "  MHA floor: its GEMMs + SDPA alone", mha[0], floor, [x, x, x], {"need_weights": False}
    lstm = pair(torch.nn.LSTM, hfai.nn.LSTM, 256, 512, 2)
    seq = leaf(100, 32, 256)
    yield "LSTM(256->512, 2 layers) s100 b32", *lstm, [seq], {}
    if device == "cpu" and with_cpu_lstm_route:
        # For the record: hfai's own route on CPU, which is not the default (see docs/nn.md).
        yield "  same, hfai's CPU route (not default)", *lstm, [seq], {_CPU_ROUTE: True}
    if device == "cuda":
        yield from _cuda_extras(pair, lstm, seq)


class _OutputOnly(torch.nn.Module):
    """An LSTM that returns only its output sequence (graph capture wants a flat output)."""

    def __init__(self, lstm: torch.nn.LSTM):
        super().__init__()
        self.lstm = lstm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


def _cuda_extras(pair, lstm, seq):
    """CUDA-only rows: half precision, and a diagnostic of the LSTM's launch overhead."""

    def half(*shape):
        return torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    ln = [m.to(torch.bfloat16) for m in pair(torch.nn.LayerNorm, hfai.nn.LayerNorm, 1024)]
    yield "LayerNorm(1024) 64x512x1024 bf16", *ln, [half(64, 512, 1024)], {}
    lstm16 = [m.to(torch.bfloat16) for m in pair(torch.nn.LSTM, hfai.nn.LSTM, 256, 512, 2)]
    yield "LSTM(256->512, 2 layers) s100 b32 bf16", *lstm16, [half(100, 32, 256)], {}
    # A small-batch LSTM step is a few microseconds of GPU work, so per-step launches from Python
    # can dominate. Replaying forward+backward of both sides as CUDA graphs removes launch costs:
    # this row shows how much of each side is left without them. Not how hfai runs today.
    try:
        graphed = [torch.cuda.make_graphed_callables(_OutputOnly(m), (seq,)) for m in lstm]
    except Exception as e:  # a diagnostic: report and go on with the table
        print(f"cuda   (LSTM as CUDA graphs: capture failed: {type(e).__name__}: {e})", flush=True)
        return
    yield "  LSTM fp32, both replayed as CUDA graphs", *graphed, [seq], {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads, both sides")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--lstm-cpu-route", action="store_true",
                        help="also time hfai's (non-default) CPU LSTM route")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}, {args.threads} CPU threads, repeats {args.repeats}, "
          f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')}")  # fmt: skip
    print("ratio = torch / hfai of the wall-time medians; 'cpu ratio' uses process CPU time,")
    print("which a machine shared with other work disturbs less (it still counts spin-waits).")
    print(f"{'device':6} {'case':42} {'torch ms':>9} {'hfai ms':>9} {'ratio':>6} {'cpu ratio':>9}")
    for device in devices:
        for name, ref, ours, inputs, call in _cases(device, args.lstm_cpu_route):
            runs = _step(ref, inputs, call), _step(ours, inputs, call)
            med = _compare(*runs, device, args.repeats)
            (w_torch, c_torch), (w_hfai, c_hfai) = med["torch"], med["hfai"]
            print(f"{device:6} {name:42} {w_torch * 1e3:9.1f} {w_hfai * 1e3:9.1f} "
                  f"{w_torch / w_hfai:5.2f}x {c_torch / c_hfai:8.2f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
