# Static checks and a live probe; gates every other stage of the recipe. Runs where Snakemake
# runs (no GPU needed for the static part).
rule env_check:
    input:
        recipe=recipe_file,
    output:
        result=f"{RESULTS}/{{recipe}}/env_check.json",
    log:
        f"{RESULTS}/{{recipe}}/snakemake/env_check.log",
    benchmark:
        f"{RESULTS}/{{recipe}}/snakemake/env_check.benchmark.tsv"
    conda:
        LAUNCHER_ENV
    params:
        recipe_sha256=recipe_sha256,
        probe=env_check_probe,
    shell:
        "recipeval env-check --recipe {input.recipe:q} --out {output.result:q} --exit-zero"
        " {params.probe} > {log:q} 2>&1"
