# Steady-state step times; gated by smoke, ordered after logprob_diff (never shares a machine with it).
rule bench:
    input:
        unpack(stage_inputs("bench")),
    output:
        result=f"{RESULTS}/{{recipe}}/bench.json",
    log:
        f"{RESULTS}/{{recipe}}/snakemake/bench.log",
    benchmark:
        f"{RESULTS}/{{recipe}}/snakemake/bench.benchmark.tsv"
    group:
        GPU_GROUP
    conda:
        LAUNCHER_ENV
    # Locally, take every core so no other job disturbs the timing (Slurm gets cpus_per_task).
    threads: workflow.cores
    resources:
        nodes=nodes,
        gres=gpu_gres,
        runtime=runtime_min("bench"),
    params:
        recipe_sha256=recipe_sha256,
        out=lambda wildcards: f"{RESULTS}/{wildcards.recipe}",
        options=run_stage_args("bench"),
    shell:
        "recipeval bench --recipe {input.recipe:q} --out {params.out:q} {params.options:q}"
        f" {RUNNER} --exit-zero 2>&1 | tee {{log:q}}"
