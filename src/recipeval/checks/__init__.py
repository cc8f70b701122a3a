"""env_check: catch a broken recipe before any GPU is allocated.

Static checks validate the recipe with the trainer stack's own code (megatron-core's config and
parallel-state set-up, SGLang's argument parser), a rule base kept as data (rules.yaml), and
memory / context / batch arithmetic. The live probe (probe.py) reads the machine it runs on.
Entry point: `recipeval.checks.run.env_check`. This package's __init__ stays import-free so that
`python -m recipeval.checks.probe` runs with the standard library alone.
"""
