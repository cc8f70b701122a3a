# A short run with the smoke overlay; gated by env_check, gates logprob_diff and bench.
rule smoke:
    input:
        unpack(stage_inputs("smoke")),
    output:
        result=f"{RESULTS}/{{recipe}}/smoke.json",
    log:
        f"{RESULTS}/{{recipe}}/snakemake/smoke.log",
    benchmark:
        f"{RESULTS}/{{recipe}}/snakemake/smoke.benchmark.tsv"
    group:
        GPU_GROUP
    conda:
        LAUNCHER_ENV
    resources:
        nodes=nodes,
        gres=gpu_gres,
        runtime=runtime_min("smoke"),
    params:
        recipe_sha256=recipe_sha256,
        out=lambda wildcards: f"{RESULTS}/{wildcards.recipe}",
        options=run_stage_args("smoke"),
    shell:
        "recipeval smoke --recipe {input.recipe:q} --out {params.out:q} {params.options:q}"
        f" {RUNNER} --exit-zero 2>&1 | tee {{log:q}}"
