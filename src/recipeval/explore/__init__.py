"""Beyond validating one recipe: the layout explorer and ablation, which turn a recipe into
ranked or attributed variants the DAG runs."""
