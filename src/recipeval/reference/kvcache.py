"""The rollout's own KV cache: two preallocated tensors written in place at fixed addresses, so
a captured CUDA graph stays valid across rollouts, and nothing of transformers' cache classes
(whose internals change from release to release) is involved.

Attention reads only a window of the slots: the decoder picks it per step (the written length,
or that length rounded up to a bucket so a few CUDA graphs cover every step) and masks the
slots past the current position. The split-KV kernel (split_kv.py) instead takes the written
length as a device tensor and reads exactly those slots.
"""

from __future__ import annotations

import torch


class KVCache:
    """keys and values of shape (layers, batch, kv_heads, max_len, head_dim)."""

    def __init__(
        self,
        layers: int,
        batch: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (layers, batch, kv_heads, max_len, head_dim)
        # Zeros, not empty: a masked slot still enters attention as 0 x value, and uninitialised
        # memory may hold NaN.
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len

    def write(
        self, layer: int, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (batch, kv_heads, T, head_dim) keys and values at `positions` (T,); returns the
        layer's whole key and value buffers."""
        layer_keys, layer_values = self.keys[layer], self.values[layer]
        layer_keys.index_copy_(2, positions, keys)
        layer_values.index_copy_(2, positions, values)
        return layer_keys, layer_values


def window_for(length: int, bucket: int, max_len: int) -> int:
    """Smallest multiple of `bucket` holding `length` tokens, capped at the cache size."""
    return min(max_len, -(-length // bucket) * bucket)
