"""Split-KV decode attention ("flash decoding") in Triton: one query token per sequence against
the first `length` slots of the KV cache.

A decode step has one query per sequence, so a kernel that gives each (sequence, KV head) one
block (as fused prefill kernels do) runs batch x kv_heads blocks: 128 for the H200 recipe, on
132 SMs, each streaming a whole context. Splitting the cache's length into chunks gives every
SM several blocks; a second, small kernel merges the chunks' partial results by their
log-sum-exp. The grid is fixed by the cache's capacity and the length is read from a device
tensor (chunks past it return at once), so one captured CUDA graph serves every step and no
attention window or mask is needed.

The G query heads that share a KV head are one block's rows (padded to 16 for the tensor
cores), so every cached key and value is read once per step. Products run on float32 tiles:
bfloat16 and float16 values are exact in TF32, so a TF32 product of bfloat16 inputs is the
bfloat16 tensor-core product, and float32 inputs multiply in IEEE float32. Scores, softmax and
the output accumulate in float32.

Triton's interpreter (TRITON_INTERPRET=1) runs these kernels on CPU tensors, which is how CI
tests them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 256  # cache slots per split: 33 splits for the H200 recipe's 8,256 slots
BLOCK_N = 64  # slots per inner iteration


@triton.jit
def _partial(
    q_ptr,
    k_ptr,
    v_ptr,
    length_ptr,
    out_ptr,
    lse_ptr,
    stride_qb,
    stride_qh,
    stride_qg,
    stride_kb,
    stride_kh,
    stride_kl,
    stride_vb,
    stride_vh,
    stride_vl,
    scale,
    kv_heads: tl.constexpr,
    splits: tl.constexpr,
    group: tl.constexpr,
    head_dim: tl.constexpr,
    block_g: tl.constexpr,
    block_d: tl.constexpr,
    chunk: tl.constexpr,
    block_n: tl.constexpr,
    precision: tl.constexpr,
):
    """Softmax-weighted values and log-sum-exp of one chunk of slots, for one sequence's
    query heads that share a KV head. out (B*Hkv, splits, G, D), lse (B*Hkv, splits, G)."""
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // kv_heads
    h = bh % kv_heads
    length = tl.load(length_ptr)
    start = split * chunk
    end = tl.minimum(start + chunk, length)
    if start < length:  # chunks past the length are never read by _merge
        rows = tl.arange(0, block_g)
        dims = tl.arange(0, block_d)
        slots = tl.arange(0, block_n)
        row_ok = rows < group
        dim_ok = dims < head_dim
        q = tl.load(
            q_ptr + b * stride_qb + h * stride_qh + rows[:, None] * stride_qg + dims[None, :],
            mask=row_ok[:, None] & dim_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        k_base = k_ptr + b * stride_kb + h * stride_kh
        v_base = v_ptr + b * stride_vb + h * stride_vh
        best = tl.full([block_g], float("-inf"), dtype=tl.float32)
        total = tl.full([block_g], 0.0, dtype=tl.float32)
        acc = tl.full([block_g, block_d], 0.0, dtype=tl.float32)
        # A fixed trip count (masked past `end`): the chunk's bounds live on the device.
        for offset in range(0, chunk, block_n):
            slot = start + offset + slots
            slot_ok = slot < end
            tile = slot_ok[:, None] & dim_ok[None, :]
            k = tl.load(k_base + slot[:, None] * stride_kl + dims[None, :], mask=tile, other=0.0)
            scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision=precision) * scale
            scores = tl.where(slot_ok[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            # A tile wholly past `end` leaves new_best at -inf: shift by 0 there, not by -inf.
            shift = tl.where(new_best == float("-inf"), 0.0, new_best)
            rescale = tl.exp(best - shift)
            weights = tl.exp(scores - shift[:, None])
            total = total * rescale + tl.sum(weights, axis=1)
            v = tl.load(v_base + slot[:, None] * stride_vl + dims[None, :], mask=tile, other=0.0)
            acc = acc * rescale[:, None] + tl.dot(
                weights, v.to(tl.float32), input_precision=precision
            )
            best = new_best
        part = bh * splits + split
        out_rows = out_ptr + (part * group + rows) * head_dim
        tl.store(
            out_rows[:, None] + dims[None, :],
            acc / total[:, None],
            mask=row_ok[:, None] & dim_ok[None, :],
        )
        tl.store(lse_ptr + part * group + rows, best + tl.log(total), mask=row_ok)


@triton.jit
def _merge(
    part_ptr,
    lse_ptr,
    length_ptr,
    out_ptr,
    splits: tl.constexpr,
    group: tl.constexpr,
    head_dim: tl.constexpr,
    block_s: tl.constexpr,
    block_d: tl.constexpr,
    chunk: tl.constexpr,
):
    """One query head's output: the chunks' partial outputs weighted by exp(lse)."""
    row = tl.program_id(0)  # (sequence, kv head, query head in the group)
    bh = row // group
    g = row % group
    used = tl.cdiv(tl.load(length_ptr), chunk)
    split = tl.arange(0, block_s)
    dims = tl.arange(0, block_d)
    split_ok = split < used
    dim_ok = dims < head_dim
    parts = (bh * splits + split) * group + g
    lse = tl.load(lse_ptr + parts, mask=split_ok, other=float("-inf"))
    weights = tl.exp(lse - tl.max(lse, axis=0))
    weights = tl.where(split_ok, weights, 0.0)
    values = tl.load(
        part_ptr + parts[:, None] * head_dim + dims[None, :],
        mask=split_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    merged = tl.sum(weights[:, None] * values, axis=0) / tl.sum(weights, axis=0)
    tl.store(out_ptr + row * head_dim + dims, merged.to(out_ptr.dtype.element_ty), mask=dim_ok)


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, length: torch.Tensor
) -> torch.Tensor:
    """q (B, Hkv, G, D): each sequence's query heads grouped by the KV head they share; keys
    and values (B, Hkv, capacity, D), last axis contiguous; length: a one-element integer
    tensor on the same device, the slots [0, length) to attend to (1 <= length <= capacity).
    Returns (B, Hkv, G, D) in q's dtype, softmax(q k^T / sqrt(D)) v over those slots."""
    b, kv_heads, group, head_dim = q.shape
    capacity = keys.shape[2]
    if keys.stride(-1) != 1 or values.stride(-1) != 1:
        raise ValueError("split-KV attention needs the cache's head axis contiguous")
    q = q.contiguous()
    splits = triton.cdiv(capacity, CHUNK)
    part = torch.empty(
        (b * kv_heads, splits, group, head_dim), dtype=torch.float32, device=q.device
    )
    lse = torch.empty((b * kv_heads, splits, group), dtype=torch.float32, device=q.device)
    block_d = max(16, triton.next_power_of_2(head_dim))
    _partial[(b * kv_heads, splits)](
        q,
        keys,
        values,
        length,
        part,
        lse,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        values.stride(0),
        values.stride(1),
        values.stride(2),
        head_dim**-0.5,
        kv_heads=kv_heads,
        splits=splits,
        group=group,
        head_dim=head_dim,
        block_g=max(16, triton.next_power_of_2(group)),
        block_d=block_d,
        chunk=CHUNK,
        block_n=BLOCK_N,
        precision="ieee" if q.dtype == torch.float32 else "tf32",
    )
    out = torch.empty_like(q)
    _merge[(b * kv_heads * group,)](
        part,
        lse,
        length,
        out,
        splits=splits,
        group=group,
        head_dim=head_dim,
        block_s=max(2, triton.next_power_of_2(splits)),
        block_d=block_d,
        chunk=CHUNK,
    )
    return out
