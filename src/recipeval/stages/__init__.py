"""Run stages (smoke, logprob_diff, bench): launch a recipe, read its log, judge it.
The shared plumbing is in stages.common; each stage module supplies its judge."""
