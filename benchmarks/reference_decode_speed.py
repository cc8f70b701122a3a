"""Rollout decode speed of the reference engine's sampler against plain `generate()`.

Same model (shape from the flags, random init: speed does not depend on the weights), same
batch of task prompts, same device and dtype. Prints one line per measurement and a JSON
summary: tokens/s (batch x new tokens / wall time) and ms per decode step.

    python benchmarks/reference_decode_speed.py --device cuda --layers 24 --hidden 1024 \
        --ffn 4096 --heads 16 --kv-heads 4 --batch 32 --new-tokens 8192 --baseline-tokens 512
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
    cuda_graph: bool,
    compile_step: bool,
    bucket: int,
) -> tuple[float, float]:
    """(setup seconds incl. graph capture, seconds for one full batch of new_tokens)."""
    decoder = StaticCacheDecoder(
        model,
        batch_size=len(prompts),
        prompt_len=PROMPT_TOKENS,
        max_new=new_tokens,
        temperature=1.0,
        top_p=1.0,
        ignore_eos=True,
        cuda_graph=cuda_graph,
        compile_step=compile_step,
        window_bucket=bucket,
    )
    start = time.perf_counter()
    decoder.generate(prompts)  # first call: cache allocation, capture (and compile)
    _sync(prompts.device)
    setup = time.perf_counter() - start
    start = time.perf_counter()
    generation = decoder.generate(prompts)
    _sync(prompts.device)
    assert generation.tokens.shape == (len(prompts), new_tokens)
    return setup, time.perf_counter() - start


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
    p.add_argument("--bucket", type=int, default=1024)
    p.add_argument("--threads", type=int, default=0)
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
        for mode in filter(None, args.modes.split(",")):
            graph, compiled = mode in ("graph", "compile-graph"), mode.startswith("compile")
            bucket = args.bucket if mode != "compile-graph" else PROMPT_TOKENS + args.new_tokens
            setup, seconds = time_decoder(model, prompts, args.new_tokens, graph, compiled, bucket)
            tps = args.batch * args.new_tokens / seconds
            summary[mode] = {
                "new_tokens": args.new_tokens,
                "seconds": seconds,
                "setup_seconds": setup,
                "tokens_per_s": tps,
                "ms_per_step": 1000 * seconds / args.new_tokens,
            }
            print(
                f"{mode}: {args.new_tokens} tokens x {args.batch} in {seconds:.2f} s = {tps:.0f} "
                f"tok/s, {1000 * seconds / args.new_tokens:.2f} ms/step (setup {setup:.1f} s)",
                flush=True,
            )
            if "generate" in summary:
                print(
                    f"  speed-up over generate(): {tps / summary['generate']['tokens_per_s']:.1f}x"
                )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
