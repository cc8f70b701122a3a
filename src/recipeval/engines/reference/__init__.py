"""The built-in reference engine: a small, real GRPO loop (torch + transformers)."""
