"""Statistics over plain tables and arrays: steady state, logprob differences, plots of a
stage's own data. Nothing here launches a job or reads a recipe."""
