"""env_check: catch a broken recipe before any GPU is allocated.

Static checks validate the recipe with the trainer stack's own code (megatron-core's config and
parallel-state set-up, SGLang's argument parser), a rule base kept as data (rules.yaml), and
memory / context / batch arithmetic. The live probe (probe.py) reads the machine it runs on.
Entry point: `recipeval.checks.env_check.env_check`; CLI `recipeval env-check`.

Check ids, by family (each check names the dotted recipe key to fix):
  layout.*     world size, expert layout, divisibility, sequence parallel, pipeline split
  rollout.*    the rollout engines tiling their GPUs (rollout-num-gpus-per-engine)
  megatron.*   megatron-core's TransformerConfig, initialize_model_parallel, microbatches
  sglang.*     --sglang-* flags through SGLang's ServerArgs parser (unknown, bad value,
               deprecated, set by miles itself)
  rule.<id>    rules.yaml; env.value-readable: values the consuming program cannot read
  memory.*     per-GPU training state + SGLang static fraction vs the GPU's memory
  context.*, batch.*   positions and context lengths; rollout batch into training steps
  probe.*      live: platform, GPU count and model, packages, trainer env versions, Ray

This package's __init__ stays import-free so that `python -m recipeval.checks.probe` runs with
the standard library alone.
"""
