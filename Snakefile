# recipeval: validate RL training recipes.
#   snakemake                       # the embedded default (recipes/local/*.yaml) on this machine
#   snakemake --profile slurm-amd   # on an AMD Slurm cluster (scripts/install-profiles.sh first)
# Per recipe: env_check -> smoke -> logprob_diff -> bench, then one publish over all recipes.
from snakemake.utils import min_version

min_version("9.0")


configfile: workflow.source_path("config/config.yaml")


include: "rules/common.smk"
include: "rules/env_check.smk"
include: "rules/smoke.smk"
include: "rules/logprob_diff.smk"
include: "rules/bench.smk"
include: "rules/publish.smk"


localrules:
    all,
    env_check,
    publish,


onsuccess:
    stop_shared_ray(log)
    print_verdicts()


onerror:
    stop_shared_ray(log)
    print_verdicts()


rule all:
    default_target: True
    input:
        rules.publish.output,
