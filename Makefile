# The two commands of the README. Both set everything up on a fresh machine first.
.PHONY: run test setup

# Validate the embedded default recipe end to end (the reference engine on this machine).
run: setup
	PATH="$(CURDIR)/.venv/bin:$$PATH" .venv/bin/snakemake --cores all

# The test suite, as CI runs it.
test:
	scripts/test.sh

setup:
	scripts/setup.sh
