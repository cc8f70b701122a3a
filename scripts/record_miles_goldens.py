"""Record the golden launches: for every miles recipe in recipes/, run its `source:` launch
script at the commit it names, from a miles checkout, with recipeval's recorder (nothing
starts), into tests/golden/miles/<recipe>.json.

    python scripts/record_miles_goldens.py --miles ~/src/miles

A recipe whose source commit is not the checkout's HEAD is recorded from that commit's tree
(`git archive`; the checkout itself is left as it is). Goldens are upstream's launches: never
edit one to match a render; differences the tests accept live in tests/golden/miles/allowed.yaml.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from recipeval.engines.miles.record import RecordError, record_at_commit
from recipeval.recipe import InvalidRecipe, load_recipe

REPO = Path(__file__).resolve().parents[1]


def miles_recipes(folder: Path) -> list[Path]:
    """Every complete recipe with engine miles (partial bases are skipped)."""
    found = []
    for path in sorted(folder.rglob("*.yaml")):
        try:
            recipe = load_recipe(path).recipe
        except InvalidRecipe:
            continue
        if recipe.engine == "miles":
            found.append(path)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--miles",
        type=Path,
        default=os.environ.get("MILES_DIR"),
        help="miles git checkout [default: MILES_DIR]",
    )
    parser.add_argument("--recipes", type=Path, default=REPO / "recipes")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "golden" / "miles")
    args = parser.parse_args(argv)
    if args.miles is None:
        parser.error("name the miles checkout: --miles DIR or MILES_DIR")
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for path in miles_recipes(args.recipes):
        recipe = load_recipe(path).recipe
        if recipe.source is None:
            print(
                f"{path}: no source: block; every miles recipe names the launch it describes",
                file=sys.stderr,
            )
            failed += 1
            continue
        source = recipe.source
        try:
            rec = record_at_commit(
                args.miles, source.commit, source.script, list(source.args), source.repo
            )
        except RecordError as err:
            print(f"{path}: {err}", file=sys.stderr)
            failed += 1
            continue
        target = args.out / f"{recipe.name}.json"
        target.write_text(rec.to_json())
        print(
            f"{target.relative_to(REPO) if target.is_relative_to(REPO) else target}: "
            f"{rec.repo}@{rec.commit[:12]} {source.script} {' '.join(source.args)}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
