"""A static KV cache whose attention reads only a window of its slots.

transformers' StaticCache preallocates max_cache_len slots and every decode step attends over
all of them (the unwritten ones masked out), so at 8k tokens each step pays for the whole
context from the first token on. Here the decoder sets a window (the written length rounded up
to a bucket) before each step: the cache still writes in place at fixed addresses, attention and
its mask cover only `window` slots, and a handful of window sizes keep CUDA graphs few.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedConfig, StaticCache
from transformers.cache_utils import StaticLayer


class WindowedStaticLayer(StaticLayer):
    def __init__(self, max_cache_len: int, **kwargs: object) -> None:
        super().__init__(max_cache_len=max_cache_len, **kwargs)
        self.window = max_cache_len

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        return keys[:, :, : self.window], values[:, :, : self.window]

    def get_mask_sizes(self, *args: object, **kwargs: object) -> tuple[int, int]:
        return self.window, 0


class WindowedStaticCache(StaticCache):
    def __init__(self, config: PreTrainedConfig, max_cache_len: int) -> None:
        super().__init__(config=config, max_cache_len=max_cache_len)
        self.layers = [WindowedStaticLayer(max_cache_len) for _ in self.layers]
        self.max_cache_len = max_cache_len

    def set_window(self, window: int) -> None:
        for layer in self.layers:
            layer.window = window


def window_for(length: int, bucket: int, max_cache_len: int) -> int:
    """Smallest multiple of `bucket` holding `length` tokens, capped at the cache size."""
    return min(max_cache_len, -(-length // bucket) * bucket)
