"""Rollout decode speed of the reference engine's sampler against plain `generate()` and
against the memory-bandwidth floor.

Same model (shape from the flags, random init: speed does not depend on the weights), same
batch of task prompts, same device and dtype. Prints one line per measurement and a JSON
summary: tokens/s (batch x new tokens / wall time), ms per decode step, and the floor: the
bytes a step must read (every weight once, plus the KV cache at the mean context length) over
the HBM bandwidth (--bandwidth, default an H200's 4.8 TB/s), with measured / floor.

The H200 recipe (recipes/local/qwen2-365m-grpo-h200.yaml):

    python benchmarks/reference_decode_speed.py --device cuda --layers 24 --hidden 1024 \
        --ffn 4096 --heads 16 --kv-heads 4 --batch 32 --new-tokens 8192 --baseline-tokens 512 \
        --modes compile-graph,graph --attention-backends triton,torch

The tiny CPU recipe's bench stage (recipes/local/tiny-grpo-cpu.yaml), eager steps:

    python benchmarks/reference_decode_speed.py --device cpu --dtype float32 --layers 2 \
        --hidden 64 --ffn 256 --heads 4 --kv-heads 2 --batch 2 --new-tokens 8192 \
        --baseline-tokens 256 --modes eager --threads 1 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from recipeval.reference.config import ModelShape
from recipeval.reference.decode import StaticCacheDecoder
from recipeval.reference.modeling import DTYPES, build_model, cast_weights, parameter_count
from recipeval.reference.task import PROMPT_TOKENS, problems
from recipeval.reference.tokenizer import EOS_ID, PAD_ID


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_generate(model: torch.nn.Module, prompts: torch.Tensor, new_tokens: int) -> float:
    """Seconds for transformers' own sampling loop with its default (dynamic) cache."""
    kwargs = {
        "do_sample": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "pad_token_id": PAD_ID,
        "eos_token_id": EOS_ID,
    }
    model.generate(prompts, **{**kwargs, "max_new_tokens": 8, "min_new_tokens": 8})  # warm-up
    _sync(prompts.device)
    start = time.perf_counter()
    out = model.generate(prompts, **kwargs)
    _sync(prompts.device)
    assert out.shape[1] == prompts.shape[1] + new_tokens
    return time.perf_counter() - start


def time_decoder(
    model: torch.nn.Module,
    prompts: torch.Tensor,
    new_tokens: int,
    attention: str,
    cuda_graph: bool,
    compile_step: bool,
    bucket: int,
    repeats: int,
    attention_backend: str,
) -> tuple[float, list[float]]:
    """(setup seconds incl. graph capture, seconds for each of `repeats` full batches)."""
    decoder = StaticCacheDecoder(
        model,
        batch_size=len(prompts),
        prompt_len=PROMPT_TOKENS,
        max_new=new_tokens,
        temperature=1.0,
        top_p=1.0,
        ignore_eos=True,
        attention=attention,
        cuda_graph=cuda_graph,
        compile_step=compile_step,
        window_bucket=bucket,
        attention_backend=attention_backend,
    )
    start = time.perf_counter()
    decoder.generate(prompts)  # first call: graph capture (and compile)
    _sync(prompts.device)
    setup = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        generation = decoder.generate(prompts)
        _sync(prompts.device)
        times.append(time.perf_counter() - start)
        assert generation.tokens.shape == (len(prompts), new_tokens)
    return setup, times


def floor_ms_per_step(model: torch.nn.Module, args: argparse.Namespace) -> dict[str, float]:
    """The bandwidth floor of one decode step: every weight read once plus the KV cache up to
    the mean context length (prompt + half the response), at `args.bandwidth` bytes/s."""
    element = torch.finfo(DTYPES[args.dtype]).bits // 8
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    head_dim = args.hidden // args.heads
    mean_context = PROMPT_TOKENS + (args.new_tokens + 1) / 2
    kv_bytes = 2 * args.layers * args.batch * args.kv_heads * head_dim * mean_context * element
    return {
        "weight_bytes": weight_bytes,
        "kv_bytes_at_mean_context": kv_bytes,
        "mean_context": mean_context,
        "bandwidth": args.bandwidth,
        "floor_ms_per_step": 1000 * (weight_bytes + kv_bytes) / args.bandwidth,
    }


def time_mode(
    model: torch.nn.Module,
    prompts: torch.Tensor,
    args: argparse.Namespace,
    mode: str,
    backend: str,
    floor_ms: float,
) -> dict[str, object]:
    """Time one decode mode with one attention backend and print its line."""
    graph, compiled = mode in ("graph", "compile-graph"), mode.startswith("compile")
    bucket = 1 if mode == "eager" else args.bucket
    setup, times = time_decoder(
        model, prompts, args.new_tokens, args.attn, graph, compiled, bucket, args.repeats, backend
    )
    seconds = min(times)
    tps = args.batch * args.new_tokens / seconds
    ms = 1000 * seconds / args.new_tokens
    ratio = ms / floor_ms
    print(
        f"{mode} ({backend} attention): {args.new_tokens} tokens x {args.batch} in {seconds:.2f} s "
        f"(best of {len(times)}: {', '.join(f'{t:.2f}' for t in times)}) = {tps:.0f} tok/s, "
        f"{ms:.3f} ms/step = {ratio:.2f}x the floor (setup {setup:.1f} s)",
        flush=True,
    )
    return {
        "new_tokens": args.new_tokens,
        "seconds": seconds,
        "all_seconds": times,
        "setup_seconds": setup,
        "tokens_per_s": tps,
        "ms_per_step": ms,
        "ratio_to_floor": ratio,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--attn", default="sdpa")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=8192)
    p.add_argument("--baseline-tokens", type=int, default=512, help="0 skips generate()")
    p.add_argument("--modes", default="graph", help="comma list of eager, graph, compile-graph")
    p.add_argument("--bucket", type=int, default=1024, help="attention-window bucket of graph mode")
    p.add_argument(
        "--attention-backends",
        default="torch",
        help="comma list of torch, triton (--rollout-attention-backend); each runs every mode",
    )
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1, help="timed batches per mode")
    p.add_argument(
        "--bandwidth", type=float, default=4.8e12, help="bytes/s of the floor (H200 HBM)"
    )
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    shape = ModelShape(
        args.layers,
        args.hidden,
        args.ffn,
        args.heads,
        args.kv_heads,
        args.vocab,
        PROMPT_TOKENS + max(args.new_tokens, args.baseline_tokens) + 64,
    )
    model = cast_weights(build_model(shape, 0, args.attn), device, DTYPES[args.dtype]).eval()
    prompts = torch.tensor(
        [q.prompt_ids() for q in problems(0, "bench", 0, args.batch)], device=device
    )
    summary: dict[str, object] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "parameters": parameter_count(model),
        "batch": args.batch,
        "dtype": args.dtype,
        "attn": args.attn,
        "torch": torch.__version__,
    }
    import transformers

    summary["transformers"] = transformers.__version__
    floor = floor_ms_per_step(model, args)
    summary["floor"] = floor
    print(
        f"floor: {floor['weight_bytes'] / 1e9:.3f} GB weights + "
        f"{floor['kv_bytes_at_mean_context'] / 1e9:.3f} GB KV cache at mean context "
        f"{floor['mean_context']:.0f} per step at {args.bandwidth / 1e12:.1f} TB/s = "
        f"{floor['floor_ms_per_step']:.3f} ms/step",
        flush=True,
    )
    with torch.inference_mode():
        if args.baseline_tokens:
            seconds = time_generate(model, prompts, args.baseline_tokens)
            tps = args.batch * args.baseline_tokens / seconds
            summary["generate"] = {
                "new_tokens": args.baseline_tokens,
                "seconds": seconds,
                "tokens_per_s": tps,
                "ms_per_step": 1000 * seconds / args.baseline_tokens,
            }
            print(
                f"generate(): {args.baseline_tokens} tokens x {args.batch} in {seconds:.2f} s = "
                f"{tps:.0f} tok/s, {1000 * seconds / args.baseline_tokens:.2f} ms/step",
                flush=True,
            )
        modes = list(filter(None, args.modes.split(",")))
        for backend in filter(None, args.attention_backends.split(",")):
            for mode in modes:
                summary[f"{mode} ({backend})"] = time_mode(
                    model, prompts, args, mode, backend, floor["floor_ms_per_step"]
                )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
