"""The stages: each module (smoke, logprob_diff, bench; env_check's checks live in
recipeval.checks) defines one `Stage` — what it launches and how it judges — and every stage
runs through stages.driver.run. stages.common holds the request and the one-launch plumbing."""
