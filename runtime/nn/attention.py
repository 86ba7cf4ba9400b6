"""MultiheadAttention: the attention core, a functional form, and the module.

Where torch's ``nn.MultiheadAttention`` loses time on CPU (profiled, batch 16, seq 256, E 512):
about a third of forward+backward is not arithmetic but memory traffic around the packed input
projection — ``_in_projection_packed`` splits the ``(L, N, 3E)`` projection with
``unflatten/transpose/contiguous`` and ``select``, whose backward zero-fills three full-size
buffers and copies into them. Here the packed projection is viewed as ``(…, 3, H, D)`` and
``unbind`` gives q, k, v as strided views (its backward is one ``stack``), the attention reads
them in place, and batch-first input is handled natively instead of transposed twice.

* ``need_weights=False``: ``F.scaled_dot_product_attention`` (the fused flash kernel on CPU and
  CUDA), the same call torch makes, so masked-out rows give the same result as torch.
* ``need_weights=True`` without masks: the output still comes from the fused kernel, and the
  averaged weights are computed beside it; autograd only runs the weights' backward when the
  caller's loss uses them.
* ``need_weights=True`` with a mask: weights are materialised and the output is
  ``weights @ v``, as in torch, so fully masked rows give NaN exactly as torch does. The same
  route runs when no gradient is being recorded (inference), where it is the cheaper one.

Not accelerated (torch's code runs unchanged): unbatched input, ``add_bias_kv``,
``add_zero_attn``, ``static_k/v``, ``is_causal=True``, dropout while training, integer masks,
tensors of mixed dtype/device, malformed shapes (so torch raises its own error).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

# Captured at import so that our fallback still reaches torch after set_replace_torch().
_TORCH_MHA_FORWARD = F.multi_head_attention_forward


def _additive_mask(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """Torch's mask convention: bool True means "do not attend" (-inf); float is added as is."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, -math.inf)


def _merged_mask(
    attn_mask: Tensor | None, key_padding_mask: Tensor | None, batch: int, heads: int, dtype
) -> Tensor | None:
    """One additive mask broadcastable to ``(N, H, L, S)``, the sum torch forms."""
    attn_mask = _additive_mask(attn_mask, dtype)
    key_padding_mask = _additive_mask(key_padding_mask, dtype)
    if attn_mask is not None:
        if attn_mask.dim() == 2:
            attn_mask = attn_mask.view(1, 1, *attn_mask.shape)
        else:
            attn_mask = attn_mask.view(batch, heads, *attn_mask.shape[1:])
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.view(batch, 1, 1, -1)
        attn_mask = key_padding_mask if attn_mask is None else attn_mask + key_padding_mask
    return attn_mask


def _heads(t: Tensor, batch_first: bool) -> Tensor:
    """``(L, N, H, D)`` or ``(N, L, H, D)`` to a ``(N, H, L, D)`` view, no copy."""
    return t.transpose(1, 2) if batch_first else t.permute(1, 2, 0, 3)


def _project(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    heads: int,
    weights: tuple[Tensor, Tensor, Tensor],
    packed_weight: Tensor | None,
    bias: Tensor | None,
    batch_first: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v as ``(N, H, L|S, D)`` views of as few projection matmuls as possible."""
    embed = weights[0].shape[0]
    b_q, b_k, b_v = bias.chunk(3) if bias is not None else (None, None, None)

    def split(t: Tensor, parts: int) -> tuple[Tensor, ...]:
        return t.unflatten(-1, (parts, heads, embed // heads)).unbind(-3)

    if packed_weight is not None and query is key and key is value:
        q, k, v = split(F.linear(query, packed_weight, bias), 3)
        return _heads(q, batch_first), _heads(k, batch_first), _heads(v, batch_first)
    q = split(F.linear(query, weights[0], b_q), 1)[0]
    if packed_weight is not None and key is value:
        kv_bias = None if bias is None else bias[embed:]
        k, v = split(F.linear(key, packed_weight[embed:], kv_bias), 2)
    else:
        k = split(F.linear(key, weights[1], b_k), 1)[0]
        v = split(F.linear(value, weights[2], b_v), 1)[0]
    return _heads(q, batch_first), _heads(k, batch_first), _heads(v, batch_first)


def _weights(q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
    scores = torch.matmul(q * (1.0 / math.sqrt(q.shape[-1])), k.transpose(-2, -1))
    if mask is not None:
        scores = scores + mask
    return torch.softmax(scores, dim=-1)


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    num_heads: int,
    in_proj_weight: Tensor | None,
    in_proj_bias: Tensor | None,
    out_proj_weight: Tensor,
    out_proj_bias: Tensor | None,
    *,
    key_padding_mask: Tensor | None = None,
    need_weights: bool = True,
    attn_mask: Tensor | None = None,
    average_attn_weights: bool = True,
    q_proj_weight: Tensor | None = None,
    k_proj_weight: Tensor | None = None,
    v_proj_weight: Tensor | None = None,
    batch_first: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The accelerated multi-head attention (no dropout, no bias_kv/zero_attn).

    Inputs are 3-D, ``(L, N, E)`` or with ``batch_first`` ``(N, L, E)``. Give ``in_proj_weight``
    (packed ``(3E, E)``) or the three ``*_proj_weight``. Returns ``(output, weights)`` with
    torch's shapes; ``weights`` is None unless ``need_weights``. Use
    :func:`multi_head_attention_forward` for torch's full argument set with fallback.
    """
    batch = query.shape[0] if batch_first else query.shape[1]
    proj: tuple[Tensor, Tensor, Tensor]
    if in_proj_weight is not None:
        w_q, w_k, w_v = in_proj_weight.chunk(3)
        proj = (w_q, w_k, w_v)
    elif q_proj_weight is not None and k_proj_weight is not None and v_proj_weight is not None:
        proj = (q_proj_weight, k_proj_weight, v_proj_weight)
    else:
        raise ValueError("attention: give in_proj_weight or all three of q/k/v_proj_weight")
    packed, bias = in_proj_weight, in_proj_bias
    q, k, v = _project(query, key, value, num_heads, proj, packed, bias, batch_first)
    mask = _merged_mask(attn_mask, key_padding_mask, batch, num_heads, q.dtype)
    weights = None
    # Without autograd the weights' backward can't be skipped, so computing them once and using
    # them for the output (as torch does) is cheaper than a second, fused pass.
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if need_weights and (mask is not None or not grad):
        weights = _weights(q, k, mask)
        out = torch.matmul(weights, v)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if need_weights:
            weights = _weights(q, k, None)
    # (N, H, L, D) -> the caller's layout, one copy into what out_proj reads.
    out = out.transpose(1, 2) if batch_first else out.permute(2, 0, 1, 3)
    out = F.linear(out.flatten(-2), out_proj_weight, out_proj_bias)
    if weights is not None and average_attn_weights:
        weights = weights.mean(dim=1)
    return out, weights


def is_accelerated(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    num_heads: int,
    *,
    bias_k=None,
    bias_v=None,
    add_zero_attn: bool = False,
    dropout_p: float = 0.0,
    training: bool = False,
    key_padding_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    static_k=None,
    static_v=None,
    is_causal: bool = False,
    batch_first: bool = False,
) -> bool:
    """True when :func:`attention` computes exactly what torch's MHA would for these arguments."""
    tensors = (query, key, value)
    if not all(isinstance(t, Tensor) and t.dim() == 3 for t in tensors):
        return False
    if query.is_nested or not torch.is_floating_point(query):
        return False
    if any(t.dtype != query.dtype or t.device != query.device for t in tensors):
        return False
    if bias_k is not None or bias_v is not None or add_zero_attn or static_k is not None:
        return False
    if static_v is not None or is_causal or (dropout_p > 0 and training):
        return False
    embed = query.shape[-1]
    if embed % num_heads:
        return False
    b = 0 if batch_first else 1
    if key.shape[:-1] != value.shape[:-1] or key.shape[b] != query.shape[b]:
        return False
    return _masks_ok(attn_mask, key_padding_mask, query, key, num_heads, batch_first)


def _masks_ok(attn_mask, key_padding_mask, query, key, num_heads, batch_first) -> bool:
    seq_dim = 1 if batch_first else 0
    batch, tgt, src = query.shape[1 - seq_dim], query.shape[seq_dim], key.shape[seq_dim]
    for mask in (attn_mask, key_padding_mask):
        if mask is not None and not (mask.dtype == torch.bool or mask.dtype == query.dtype):
            return False
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (batch, src):
        return False
    if attn_mask is None:
        return True
    if attn_mask.dim() == 2:
        return tuple(attn_mask.shape) == (tgt, src)
    return attn_mask.dim() == 3 and tuple(attn_mask.shape) == (batch * num_heads, tgt, src)


def multi_head_attention_forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    embed_dim_to_check: int,
    num_heads: int,
    in_proj_weight: Tensor | None,
    in_proj_bias: Tensor | None,
    bias_k: Tensor | None,
    bias_v: Tensor | None,
    add_zero_attn: bool,
    dropout_p: float,
    out_proj_weight: Tensor,
    out_proj_bias: Tensor | None,
    training: bool = True,
    key_padding_mask: Tensor | None = None,
    need_weights: bool = True,
    attn_mask: Tensor | None = None,
    use_separate_proj_weight: bool = False,
    q_proj_weight: Tensor | None = None,
    k_proj_weight: Tensor | None = None,
    v_proj_weight: Tensor | None = None,
    static_k: Tensor | None = None,
    static_v: Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Drop-in for ``torch.nn.functional.multi_head_attention_forward`` (sequence-first).

    Same arguments and results; the cases listed in this module's docstring run torch's own
    function.
    """
    args = (
        query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias,
        bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training,
        key_padding_mask, need_weights, attn_mask, use_separate_proj_weight,
        q_proj_weight, k_proj_weight, v_proj_weight, static_k, static_v,
        average_attn_weights, is_causal,
    )  # fmt: skip
    ok = is_accelerated(
        query, key, value, num_heads, bias_k=bias_k, bias_v=bias_v, add_zero_attn=add_zero_attn,
        dropout_p=dropout_p, training=training, key_padding_mask=key_padding_mask,
        attn_mask=attn_mask, static_k=static_k, static_v=static_v, is_causal=is_causal,
    )  # fmt: skip
    if not ok or query.shape[-1] != embed_dim_to_check:
        return _TORCH_MHA_FORWARD(*args)
    return attention(
        query, key, value, num_heads,
        None if use_separate_proj_weight else in_proj_weight, in_proj_bias,
        out_proj_weight, out_proj_bias,
        key_padding_mask=key_padding_mask, need_weights=need_weights, attn_mask=attn_mask,
        average_attn_weights=average_attn_weights, q_proj_weight=q_proj_weight,
        k_proj_weight=k_proj_weight, v_proj_weight=v_proj_weight,
    )  # fmt: skip


class MultiheadAttention(torch.nn.MultiheadAttention):
    """``torch.nn.MultiheadAttention`` with a faster forward/backward; same arguments,
    parameters and ``state_dict``, outputs equal to float rounding.

    Batch-first input is handled natively. The cases listed in :mod:`hfai.nn.attention`'s
    docstring (unbatched input, ``add_bias_kv``, ``add_zero_attn``, ``is_causal``, dropout while
    training, ...) run ``torch.nn.MultiheadAttention.forward`` unchanged.
    """

    def forward(  # noqa: D102 (same contract as torch.nn.MultiheadAttention.forward)
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        ok = is_accelerated(
            query, key, value, self.num_heads, bias_k=self.bias_k, bias_v=self.bias_v,
            add_zero_attn=self.add_zero_attn, dropout_p=self.dropout, training=self.training,
            key_padding_mask=key_padding_mask, attn_mask=attn_mask, is_causal=is_causal,
            batch_first=self.batch_first,
        )  # fmt: skip
        ok = ok and query.shape[-1] == self.embed_dim and self._params_match(query)
        if not ok or (need_weights and self._torch_fast_path_likely(query, key, value)):
            return super().forward(
                query, key, value, key_padding_mask, need_weights, attn_mask,
                average_attn_weights, is_causal,
            )  # fmt: skip
        separate = not self._qkv_same_embed_dim
        return attention(
            query, key, value, self.num_heads,
            None if separate else self.in_proj_weight, self.in_proj_bias,
            self.out_proj.weight, self.out_proj.bias,
            key_padding_mask=key_padding_mask, need_weights=need_weights, attn_mask=attn_mask,
            average_attn_weights=average_attn_weights, q_proj_weight=self.q_proj_weight,
            k_proj_weight=self.k_proj_weight, v_proj_weight=self.v_proj_weight,
            batch_first=self.batch_first,
        )  # fmt: skip

    def _torch_fast_path_likely(self, query: Tensor, key: Tensor, value: Tensor) -> bool:
        """The main conditions of torch's fused inference path (``_native_multi_head_attention``).

        Measured on CPU it beats hfai's route when the weights are requested, not when they are
        not (docs/performance.md), so only the former is handed to torch. Should torch decline for
        a reason not checked here, its regular path runs: same results, as always on fallback.
        """
        if self.training or not self.batch_first or not (query is key and key is value):
            return False
        if not self._qkv_same_embed_dim or self.num_heads % 2:
            return False
        return not (
            torch.is_grad_enabled()
            and (query.requires_grad or any(p.requires_grad for p in self.parameters()))
        )

    def _params_match(self, query: Tensor) -> bool:
        return all(p.dtype == query.dtype and p.device == query.device for p in self.parameters())
