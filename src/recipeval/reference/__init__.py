"""The reference trainer: a small, real GRPO loop (torch + transformers) that the reference
engine (recipeval.engines.reference) launches.

Entry point: `python -m recipeval.reference` (__main__.py). Pieces: config (flags),
task + tokenizer (prompts, reward), modeling (Qwen2-style LM), warmstart (the starting policy;
its docstring says why a cached supervised warm start), decode + forward + kvcache (the
sampler over its own KV cache, transformers' model used for weights only),
rollout (worker), trainer (GRPO step), loop (driver, local or Ray), noncolocated + weightsync
(the rollout worker in a process of its own, weights by torch.distributed broadcast), logfmt
(miles' log lines), dump (per-token Parquet). It depends on no other recipeval package: it is
the trainer, launched as its own process.
"""
