"""The built-in reference engine: a small, real GRPO loop (torch + transformers).

Entry point: `python -m recipeval.engines.reference` (__main__.py). Pieces: config (flags),
task + tokenizer (prompts, reward), modeling (Qwen2-style LM), warmstart (the starting policy;
its docstring says why a cached supervised warm start), decode + kvcache (static-cache sampler),
rollout (worker), trainer (GRPO step), loop (driver, local or Ray), logfmt (miles' log lines),
dump (per-token Parquet). This file stays free of heavy imports: render imports the package.
"""
