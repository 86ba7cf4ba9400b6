"""LSTM: one autograd.Function per layer and direction, a functional form, and the module.

The layer Function batches the input projection of all time steps into one matmul (both biases
folded in), runs the recurrence as one ``addmm`` plus a fused step per time step, and has a
hand-written backward: the per-step work is one ``addmm`` for the recurrent gradient and a fused
pointwise step, and the weight gradients are three large matmuls over the whole sequence after
the loop (the input gradient is skipped when nothing needs it).

Where it runs: on CUDA with triton, the step is one Triton kernel forward and one backward
(``hfai.nn.triton_lstm``). On CPU torch's own kernel runs: measured on the benchmark shape, torch
already does the same batching (oneDNN for float32, its generic path for float64) and both it and
this implementation are bound by the same matrix products (the step ``addmm`` and the weight
gradients are >85% of the time), so this route was ~1.0x single-threaded and slower when the
machine is shared (more, smaller parallel regions per step). It is kept, pure torch, as the
reference twin of the CUDA route (tests run it on CPU) and for explicit use via
:func:`lstm_layer`.

Cases not accelerated run ``torch.nn.LSTM``'s own code unchanged: CPU tensors, CUDA without
triton, packed sequences, ``proj_size > 0``, dropout between layers while training (torch's
random stream is kept), dtypes other than float32/float16/bfloat16.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from hfai.nn._backend import use_triton

_CPU_DTYPES = (torch.float32, torch.float64)
_CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# False: CPU tensors run torch's kernel (see the module docstring for the measurement). Tests set
# it to True to run this module's own route on CPU, the same code CUDA runs but for the step.
_ROUTE_CPU = False


def _cell_forward_torch(gates: Tensor, c_prev: Tensor, c: Tensor, h: Tensor, tc: Tensor) -> None:
    hidden = c_prev.shape[-1]
    gates[:, : 2 * hidden].sigmoid_()
    gates[:, 2 * hidden : 3 * hidden].tanh_()
    gates[:, 3 * hidden :].sigmoid_()
    i, f, g, o = gates.split(hidden, dim=1)
    torch.mul(f, c_prev, out=c)
    c.addcmul_(i, g)
    torch.tanh(c, out=tc)
    torch.mul(o, tc, out=h)


def _recurrence_backward_torch(
    d_out: Tensor, d_hn: Tensor, d_cn: Tensor, gates: Tensor, cs: Tensor, tcs: Tensor, w_hh: Tensor
) -> tuple[Tensor, Tensor]:
    """Gradients of the pre-activation gates for all steps, and of ``c_0``."""
    steps, batch, four_h = gates.shape
    hidden = four_h // 4
    i, f, g, o = gates.split(hidden, dim=2)
    # Everything that does not depend on the running gradient, for all steps in a few big ops.
    coef = torch.empty_like(gates)
    ci, cf, cg, co = coef.split(hidden, dim=2)
    torch.mul(g, i * (1 - i), out=ci)
    torch.mul(cs[:-1], f * (1 - f), out=cf)
    torch.mul(i, 1 - g * g, out=cg)
    torch.mul(tcs, o * (1 - o), out=co)
    dc_per_dh = o * (1 - tcs * tcs)
    d_gates = torch.empty_like(gates)
    dc = d_cn.clone()
    dh = d_out[steps - 1] + d_hn
    for t in range(steps - 1, -1, -1):
        if t < steps - 1:
            dh = torch.addmm(d_out[t], d_gates[t + 1], w_hh)
        dc.addcmul_(dh, dc_per_dh[t])
        torch.mul(
            coef[t, :, : 3 * hidden].view(batch, 3, hidden),
            dc.unsqueeze(1),
            out=d_gates[t, :, : 3 * hidden].view(batch, 3, hidden),
        )
        torch.mul(co[t], dh, out=d_gates[t, :, 3 * hidden :])
        dc.mul_(f[t])
    return d_gates, dc


def _recurrence_backward_triton(
    d_out: Tensor, d_hn: Tensor, d_cn: Tensor, gates: Tensor, cs: Tensor, tcs: Tensor, w_hh: Tensor
) -> tuple[Tensor, Tensor]:
    from hfai.nn import triton_lstm

    d_out = d_out.contiguous()
    d_gates = torch.empty_like(gates)
    dc = d_cn.float().contiguous().clone()
    dh_rec = d_hn.contiguous()
    for t in range(gates.shape[0] - 1, -1, -1):
        triton_lstm.cell_backward(d_out[t], dh_rec, dc, gates[t], cs[t], tcs[t], d_gates[t])
        dh_rec = torch.mm(d_gates[t], w_hh)
    return d_gates, dc.to(gates.dtype)


class LSTMLayerFunction(torch.autograd.Function):
    """One LSTM layer in one direction over a whole sequence, ``x`` of shape ``(T, B, I)``.

    Returns ``(out (T, B, H), h_T, c_T)``. Gate order and weight layout are torch's
    (``i, f, g, o``; ``w_ih (4H, I)``, ``w_hh (4H, H)``). Biases may be ``None``. ``triton``
    forces the step kernel (tests run the Triton one on CPU under ``TRITON_INTERPRET=1``);
    ``None`` picks Triton for CUDA tensors when it is installed.
    """

    @staticmethod
    def forward(ctx, x, h0, c0, w_ih, w_hh, b_ih, b_hh, triton=None):  # noqa: D102
        steps, batch, _ = x.shape
        hidden = w_hh.shape[1]
        triton = use_triton(x) if triton is None else triton
        gates = _input_projection(x, w_ih, b_ih, b_hh).view(steps, batch, 4 * hidden)
        hs = x.new_empty(steps + 1, batch, hidden)
        # The Triton step keeps the cell state in fp32 (it is carried through every step).
        cs = x.new_empty(steps + 1, batch, hidden, dtype=torch.float32 if triton else x.dtype)
        tcs = x.new_empty(steps, batch, hidden)
        hs[0].copy_(h0)
        cs[0].copy_(c0)
        w_hh_t = w_hh.t()
        if triton:
            from hfai.nn.triton_lstm import cell_forward
        else:
            cell_forward = _cell_forward_torch
        for t in range(steps):
            gates[t].addmm_(hs[t], w_hh_t)
            cell_forward(gates[t], cs[t], cs[t + 1], hs[t + 1], tcs[t])
        ctx.triton = triton
        ctx.save_for_backward(x, w_ih, w_hh, gates, hs, cs, tcs)
        ctx.has_bias = b_ih is not None
        return hs[1:], hs[steps].clone(), cs[steps].to(x.dtype, copy=True)

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out, d_hn, d_cn):  # noqa: D102 (autograd protocol)
        x, w_ih, w_hh, gates, hs, cs, tcs = ctx.saved_tensors
        steps, batch, four_h = gates.shape
        backward = _recurrence_backward_triton if ctx.triton else _recurrence_backward_torch
        d_gates, d_c0 = backward(d_out, d_hn, d_cn, gates, cs, tcs, w_hh)
        flat = d_gates.view(steps * batch, four_h)
        need = ctx.needs_input_grad
        d_x = torch.mm(flat, w_ih).view_as(x) if need[0] else None
        d_h0 = torch.mm(d_gates[0], w_hh) if need[1] else None
        d_w_ih = torch.mm(flat.t(), x.reshape(steps * batch, -1)) if need[3] else None
        d_w_hh = torch.mm(flat.t(), hs[:-1].reshape(steps * batch, -1)) if need[4] else None
        d_b = flat.sum(0) if ctx.has_bias and (need[5] or need[6]) else None
        return d_x, d_h0, d_c0 if need[2] else None, d_w_ih, d_w_hh, d_b, d_b, None


def _input_projection(x: Tensor, w_ih: Tensor, b_ih: Tensor | None, b_hh: Tensor | None) -> Tensor:
    """``x @ w_ih^T + b_ih + b_hh`` for all time steps in one matmul, as ``(T*B, 4H)``."""
    flat = x.reshape(-1, x.shape[-1])
    if b_ih is None:
        return torch.mm(flat, w_ih.t())
    if b_hh is None:
        raise TypeError("lstm_layer: b_ih is given but b_hh is None; pass both biases or neither")
    return torch.addmm(b_ih + b_hh, flat, w_ih.t())


def lstm_layer(
    x: Tensor,
    h0: Tensor,
    c0: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor | None = None,
    b_hh: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Functional form of one layer, one direction: see :class:`LSTMLayerFunction`."""
    return LSTMLayerFunction.apply(x.contiguous(), h0, c0, w_ih, w_hh, b_ih, b_hh)


def is_accelerated(input: Tensor, params: Sequence[Tensor], dropout: float, train: bool) -> bool:
    """True when :func:`lstm` runs hfai's code for these arguments (else it calls torch's)."""
    if not isinstance(input, Tensor) or input.dim() != 3:
        return False
    if dropout > 0 and train:
        return False
    if any(p.device != input.device or p.dtype != input.dtype for p in params):
        return False
    if input.is_cuda:
        return use_triton(input) and input.dtype in _CUDA_DTYPES
    return _ROUTE_CPU and input.device.type == "cpu" and input.dtype in _CPU_DTYPES


def lstm(
    input: Tensor,
    hx: tuple[Tensor, Tensor],
    params: list[Tensor] | tuple[Tensor, ...],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Drop-in for ``torch._VF.lstm`` (the call ``nn.LSTM.forward`` makes) on a padded batch.

    ``input`` is 3-D, ``hx = (h0, c0)`` each ``(num_layers * num_directions, B, H)``, ``params``
    the module's ``_flat_weights``. Returns ``(output, h_n, c_n)``. Cases hfai does not accelerate
    (see :func:`is_accelerated`) go to torch unchanged.
    """
    if not is_accelerated(input, params, dropout, train):
        return torch._VF.lstm(
            input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first
        )
    h0, c0 = hx
    directions = 2 if bidirectional else 1
    per_layer = 4 if has_biases else 2
    layer_input = input.transpose(0, 1) if batch_first else input
    h_n: list[Tensor] = []
    c_n: list[Tensor] = []
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            idx = layer * directions + direction
            w = params[idx * per_layer : (idx + 1) * per_layer]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
            # The reverse direction is the forward recurrence over the flipped sequence.
            x = layer_input if direction == 0 else layer_input.flip(0)
            out, h, c = lstm_layer(x, h0[idx], c0[idx], w[0], w[1], b_ih, b_hh)
            outputs.append(out if direction == 0 else out.flip(0))
            h_n.append(h)
            c_n.append(c)
        layer_input = outputs[0] if directions == 1 else torch.cat(outputs, dim=-1)
        if dropout > 0 and train and layer < num_layers - 1:
            layer_input = torch.nn.functional.dropout(layer_input, dropout, True)
    output = layer_input.transpose(0, 1) if batch_first else layer_input
    return output, torch.stack(h_n), torch.stack(c_n)


class LSTM(torch.nn.LSTM):
    """``torch.nn.LSTM`` with hfai's route on CUDA; same arguments, parameters, ``state_dict``.

    Accelerated on CUDA with triton: padded (non-packed) input, batched or unbatched,
    ``batch_first``, bidirectional, any number of layers, given or zero initial state,
    float32/float16/bfloat16; outputs match torch to float rounding (the order of sums differs),
    not bit for bit. Everything else, including all CPU tensors (torch's CPU kernel is already
    as fast, see :mod:`hfai.nn.lstm`), runs ``torch.nn.LSTM.forward`` unchanged.
    """

    def forward(self, input, hx=None):  # noqa: D102 (same contract as torch.nn.LSTM.forward)
        weights = self._hfai_weights(input, hx)
        if weights is None:
            return super().forward(input, hx)
        batched = input.dim() == 3
        if not batched:
            input = input.unsqueeze(1)
            hx = None if hx is None else (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
        if hx is None:
            hx = self._zero_state(input)
        else:
            self.check_forward_args(input, hx, None)
        output, h_n, c_n = lstm(
            input,
            hx,
            weights,
            self.bias,
            self.num_layers,
            float(self.dropout),
            self.training,
            self.bidirectional,
            self.batch_first,
        )
        if not batched:
            return output.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        return output, (h_n, c_n)

    def _hfai_weights(self, input, hx) -> list[Tensor] | None:
        """The flat weights when hfai's route runs this call; None when torch's code runs it."""
        if not isinstance(input, Tensor) or input.dim() not in (2, 3) or self.proj_size > 0:
            return None
        if hx is not None and not (
            isinstance(hx, tuple)
            and len(hx) == 2
            and all(h.dtype == input.dtype and h.device == input.device for h in hx)
        ):
            return None  # torch reports the mismatch (or handles what it accepts)
        # An entry is None only while a weight is being reparametrized: torch's code handles that.
        weights = [w for w in self._flat_weights if w is not None]
        if len(weights) != len(self._flat_weights):
            return None
        probe = input if input.dim() == 3 else input.unsqueeze(1)
        return weights if is_accelerated(probe, weights, float(self.dropout), self.training) else None

    def _zero_state(self, input: Tensor) -> tuple[Tensor, Tensor]:
        batch = input.shape[0] if self.batch_first else input.shape[1]
        shape = (self.num_layers * (2 if self.bidirectional else 1), batch, self.hidden_size)
        zeros = torch.zeros(shape, dtype=input.dtype, device=input.device)
        return zeros, zeros
