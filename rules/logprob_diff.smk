# Train-vs-rollout logprob statistics per variant; gated by smoke.
rule logprob_diff:
    input:
        unpack(stage_inputs("logprob_diff")),
    output:
        result=f"{RESULTS}/{{recipe}}/logprob_diff.json",
    log:
        f"{RESULTS}/{{recipe}}/snakemake/logprob_diff.log",
    benchmark:
        f"{RESULTS}/{{recipe}}/snakemake/logprob_diff.benchmark.tsv"
    group:
        GPU_GROUP
    conda:
        LAUNCHER_ENV
    resources:
        nodes=nodes,
        gres=gpu_gres,
        runtime=runtime_min("logprob_diff"),
    params:
        recipe_sha256=recipe_sha256,
        out=lambda wildcards: f"{RESULTS}/{wildcards.recipe}",
        options=run_stage_args("logprob_diff"),
    shell:
        "recipeval logprob-diff --recipe {input.recipe:q} --out {params.out:q} {params.options:q}"
        f" {RUNNER} --exit-zero 2>&1 | tee {{log:q}}"
