"""Checks of the split-KV decode attention kernel (--rollout-attention-backend triton): against
softmax attention in float64 at lengths on and around its chunk and block edges, and through
the decoder (on a GPU also with compiled pieces and CUDA graphs) against transformers' full
forward.

With TRITON_INTERPRET=1 they run on CPU tensors in Triton's interpreter: CI runs them so, from
tests/test_reference_split_kv.py, in a pytest of their own (the interpreter must be on before
Triton is first imported). Without it they run on the GPU:
`python -m pytest tests/split_kv_checks.py` on a CUDA machine."""

from __future__ import annotations

import os

import pytest
import torch
from test_reference_decode import full_forward_logprobs, model_and_prompts

from recipeval.reference import split_kv
from recipeval.reference.decode import StaticCacheDecoder
from recipeval.reference.task import PROMPT_TOKENS

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("no GPU: run with TRITON_INTERPRET=1", allow_module_level=True)
DEVICE = torch.device("cpu" if INTERPRET else "cuda")


def softmax_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    q, keys, values = q.double(), keys.double(), values.double()
    scores = q @ keys.transpose(-1, -2) / q.shape[-1] ** 0.5
    return torch.softmax(scores, dim=-1) @ values


@pytest.mark.parametrize(
    ("dtype", "group", "head_dim", "tolerance"),
    [(torch.float32, 4, 64, 1e-5), (torch.bfloat16, 4, 64, 1e-2), (torch.float32, 3, 40, 1e-5)],
)
def test_kernel_matches_softmax_attention_over_the_written_slots(dtype, group, head_dim, tolerance):
    chunk, block = split_kv.CHUNK, split_kv.BLOCK_N
    capacity = 2 * chunk + block
    torch.manual_seed(0)
    # The decoder's layout: one layer of a (layers, B, Hkv, capacity, D) cache, and slots past
    # the length hold values that would change the result if they were read.
    cache = torch.randn(2, 2, 2, 2, capacity, head_dim).to(DEVICE, dtype)
    keys, values = cache[0, 1], cache[1, 1]
    q = torch.randn(2, 2, group, head_dim).to(DEVICE, dtype)
    for length in (1, block - 1, block, chunk - 1, chunk, chunk + 1, capacity):
        out = split_kv.decode_attention(q, keys, values, torch.tensor([length], device=DEVICE))
        assert out.dtype == dtype and out.shape == q.shape
        expected = softmax_attention(q, keys[:, :, :length], values[:, :, :length])
        error = (out.double() - expected).abs().max().item()
        assert error < tolerance, f"length {length}: max |error| {error:.2e}"


@pytest.mark.parametrize(
    "fast", [False, pytest.param(True, marks=pytest.mark.skipif(INTERPRET, reason="CUDA only"))]
)
def test_decoder_with_the_kernel_samples_the_full_forward_logprobs(fast):
    model, prompts = model_and_prompts("sdpa")
    model, prompts = model.to(DEVICE), prompts.to(DEVICE)
    # 12 steps: the interpreter runs each kernel instance in Python.
    decoder = StaticCacheDecoder(
        model,
        3,
        PROMPT_TOKENS,
        12,
        1.0,
        1.0,
        ignore_eos=True,
        cuda_graph=fast,
        compile_step=fast,
        attention_backend="triton",
    )
    assert decoder.decode_attention is split_kv.decode_attention
    torch.manual_seed(0)
    generation = decoder.generate(prompts)
    assert len(set(generation.tokens.flatten().tolist())) > 5  # a real sample, not one token
    reference = full_forward_logprobs(model, prompts, generation.tokens)
    assert (generation.logprobs - reference).abs().max().item() < 1e-4
    assert torch.equal(decoder.score(prompts, generation.tokens), generation.logprobs)
