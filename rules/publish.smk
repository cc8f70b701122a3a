# Tables, plots, history, regression verdict and JUnit XML over every selected recipe and
# stage. Exits 0 whenever it wrote its outputs; `recipeval nightly` turns the verdict into an
# exit status.
HISTORY = config["history"]
PUBLISH = config["publish"]


rule publish:
    input:
        results=all_results(),
    output:
        md=report(
            f"{RESULTS}/tables/benchmarks.md",
            category="Tables",
            labels={"format": "md"},
        ),
        csv=report(
            f"{RESULTS}/tables/benchmarks.csv",
            category="Tables",
            labels={"format": "csv"},
        ),
        html=report(
            f"{RESULTS}/tables/benchmarks.html",
            category="Tables",
            labels={"format": "html (tables and plots)"},
        ),
        plots=report(
            directory(f"{RESULTS}/tables/plots"),
            patterns=["{group}/{plot}.png"],
            category="Plots",
            subcategory="{group}",
            labels={"recipe": "{group}", "plot": "{plot}"},
        ),
        junit=f"{RESULTS}/junit.xml",
        verdict=f"{RESULTS}/regression.json",
        parquet=f"{HISTORY}/history.parquet",
    log:
        f"{RESULTS}/logs/publish.log",
    benchmark:
        f"{RESULTS}/logs/publish.benchmark.tsv"
    conda:
        LAUNCHER_ENV
    params:
        tables=lambda wildcards, output: os.path.dirname(output.md),
        history=lambda wildcards, output: os.path.dirname(output.parquet),
        min_change=PUBLISH["min_change"],
        alpha=PUBLISH["alpha"],
        min_history=PUBLISH["min_history"],
        short_history_band=PUBLISH["short_history_band"],
    shell:
        "recipeval publish {input.results:q} --tables {params.tables:q}"
        " --history {params.history:q} --plot-dir {output.plots:q} --junit {output.junit:q} --verdict {output.verdict:q}"
        " --min-change {params.min_change} --alpha {params.alpha}"
        " --min-history {params.min_history} --short-history-band {params.short_history_band}"
        " > {log:q} 2>&1"
