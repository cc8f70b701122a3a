"""The rollout's forward pass of the Qwen2-style policy over its own KV cache.

It reads the model's weights by their checkpoint names (the state-dict format every
transformers release loads and saves) and does the arithmetic of transformers' Qwen2 layers
itself: RMSNorm in float32, RoPE from the model's float32 inverse frequencies, grouped-query
attention, SwiGLU MLP, tied or untied head. So no transformers cache class or forward argument
(`past_key_values`, `cache_position`, ...) is involved, and the trainer's full forward through
transformers recomputes the same logprobs to float32 round-off.

Grouped-query attention without copying the cache: the G query heads that share a KV head are
folded into the query-length axis, so each step reads every cached key and value once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from recipeval.reference.kvcache import KVCache


@dataclass
class Fused:
    """Several of the model's weights concatenated along the output axis (one matmul instead of
    three); `refresh` copies the model's current values in, in place."""

    sources: list[torch.Tensor]
    tensor: torch.Tensor

    @classmethod
    def of(cls, sources: list[torch.Tensor]) -> Fused:
        return cls(sources, torch.cat(sources))

    def refresh(self) -> None:
        torch.cat(self.sources, out=self.tensor)


@dataclass
class Layer:
    input_norm: torch.Tensor
    qkv_weight: Fused
    qkv_bias: Fused | None
    o_weight: torch.Tensor
    post_norm: torch.Tensor
    gate_up_weight: Fused
    down_weight: torch.Tensor


@dataclass
class Weights:
    """The model's own parameters (views: in-place weight updates show here) and fused copies
    of some of them (stale after an update until `refresh`)."""

    embed: torch.Tensor
    layers: list[Layer]
    final_norm: torch.Tensor
    head: torch.Tensor
    inv_freq: torch.Tensor  # float32 (head_dim / 2,)
    heads: int
    kv_heads: int
    head_dim: int
    eps: float

    def refresh(self) -> None:
        for layer in self.layers:
            for fused in (layer.qkv_weight, layer.qkv_bias, layer.gate_up_weight):
                if fused is not None:
                    fused.refresh()


def weights_of(model: torch.nn.Module) -> Weights:
    """The decode weights of a transformers Qwen2ForCausalLM, found by its checkpoint names."""
    params = model.state_dict()
    buffers = dict(model.named_buffers())
    config = model.config

    def layer(i: int) -> Layer:
        p = f"model.layers.{i}."
        qkv = [p + f"self_attn.{name}_proj." for name in "qkv"]
        biases = [params.get(name + "bias") for name in qkv]
        return Layer(
            input_norm=params[p + "input_layernorm.weight"],
            qkv_weight=Fused.of([params[name + "weight"] for name in qkv]),
            qkv_bias=Fused.of(biases) if all(b is not None for b in biases) else None,
            o_weight=params[p + "self_attn.o_proj.weight"],
            post_norm=params[p + "post_attention_layernorm.weight"],
            gate_up_weight=Fused.of(
                [params[p + "mlp.gate_proj.weight"], params[p + "mlp.up_proj.weight"]]
            ),
            down_weight=params[p + "mlp.down_proj.weight"],
        )

    layers = [layer(i) for i in range(config.num_hidden_layers)]
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    return Weights(
        embed=model.get_input_embeddings().weight.detach(),
        layers=layers,
        final_norm=params["model.norm.weight"],
        head=model.get_output_embeddings().weight.detach(),
        inv_freq=buffers["model.rotary_emb.inv_freq"].float(),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=params["model.layers.0.self_attn.q_proj.weight"].shape[0] // heads,
        eps=config.rms_norm_eps,
    )


def rope_tables(
    weights: Weights, length: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin for positions 0..length-1, (length, head_dim), computed in float32 and
    cast to the activations' dtype as transformers does. The sin table's first half is negated:
    rotating x is then x * cos + roll(x, half) * sin, exactly transformers'
    x * cos + cat(-x2, x1) * sin (a sign flip rounds the same either way)."""
    positions = torch.arange(length, device=weights.inv_freq.device, dtype=torch.float32)
    freqs = positions[:, None] * weights.inv_freq[None, :]
    cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * sin


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None, attention: str
) -> torch.Tensor:
    """q (B, Hkv, G*T, D) against k, v (B, Hkv, W, D); allowed (G*T, W) bool or None (all)."""
    scale = q.shape[-1] ** -0.5
    if attention == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)


def _pre_attention(
    x: torch.Tensor,
    norm: torch.Tensor,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    cos_t: torch.Tensor,
    sin_t: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated queries and keys (B, H + Hkv, T, D) and values (B, Hkv, T, D) of `x` (B, T, E)."""
    b, t, _ = x.shape
    d = qkv_weight.shape[0] // (heads + 2 * kv_heads)
    qkv = F.linear(_rms_norm(x, norm, eps), qkv_weight, qkv_bias)
    qkv = qkv.view(b, t, heads + 2 * kv_heads, d).transpose(1, 2)
    return _rotate(qkv[:, : heads + kv_heads], cos_t, sin_t), qkv[:, heads + kv_heads :]


def _post_attention(
    x: torch.Tensor,
    attended: torch.Tensor,
    o_weight: torch.Tensor,
    norm: torch.Tensor,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """The layer's output: `x` plus the projected attention output, plus the MLP of that."""
    x = x + F.linear(attended, o_weight)
    gate, up = F.linear(_rms_norm(x, norm, eps), gate_up_weight).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, down_weight)


@dataclass(frozen=True)
class Kernels:
    """The per-layer pieces around attention. Compiled, each piece's elementwise work (norms,
    RoPE, residuals, SwiGLU) fuses into a few kernels, which is most of a decode step's launch
    count. The cache writes and attention stay outside: compiled, an in-place write into the
    cache buffer becomes a copy of the whole buffer (60 ms a step on an H200, against 3.9)."""

    pre_attention: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    post_attention: Callable[..., torch.Tensor]


EAGER = Kernels(_pre_attention, _post_attention)


def compiled_kernels() -> Kernels:
    """The per-layer pieces through torch.compile (shapes fixed: one compile per shape, shared
    by every layer)."""
    return Kernels(
        torch.compile(_pre_attention, fullgraph=True, dynamic=False),
        torch.compile(_post_attention, fullgraph=True, dynamic=False),
    )


def forward(
    weights: Weights,
    cache: KVCache,
    cos: torch.Tensor,
    sin: torch.Tensor,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    window: int,
    allowed: torch.Tensor | None,
    attention: str,
    kernels: Kernels = EAGER,
    decode_attention: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:
    """Logits (B, vocab) of the last of `tokens` (B, T) at `positions` (T,), after writing their
    keys and values into `cache`; attention covers cache slots [0, window), `allowed` (T, window)
    masks them per query (None: every slot). With `decode_attention` (split_kv's signature), a
    one-token step attends to exactly slots [0, position] instead, and window and mask are
    unused."""
    b, t = tokens.shape
    h, hkv, d = weights.heads, weights.kv_heads, weights.head_dim
    g = h // hkv
    cos_t = cos.index_select(0, positions)  # (T, D), broadcast over batch and heads
    sin_t = sin.index_select(0, positions)
    folded = allowed.repeat(g, 1) if allowed is not None else None
    one_token = decode_attention if t == 1 else None
    # (1,): the written slots a one-token step attends to; not computed for other steps.
    length = positions + 1 if one_token is not None else None
    x = F.embedding(tokens, weights.embed)
    for i, layer in enumerate(weights.layers):
        bias = layer.qkv_bias.tensor if layer.qkv_bias is not None else None
        qk, v = kernels.pre_attention(
            x, layer.input_norm, layer.qkv_weight.tensor, bias, cos_t, sin_t, weights.eps, h, hkv
        )
        keys, values = cache.write(i, positions, qk[:, h:], v)
        q = qk[:, :h].reshape(b, hkv, g * t, d)
        if one_token is not None:
            out = one_token(q, keys, values, length)
        else:
            out = _attend(q, keys[:, :, :window], values[:, :, :window], folded, attention)
        out = out.reshape(b, h, t, d).transpose(1, 2).reshape(b, t, h * d)
        x = kernels.post_attention(
            x,
            out,
            layer.o_weight,
            layer.post_norm,
            layer.gate_up_weight.tensor,
            layer.down_weight,
            weights.eps,
        )
    last = _rms_norm(x[:, -1], weights.final_norm, weights.eps)
    return F.linear(last, weights.head)
