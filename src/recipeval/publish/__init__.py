"""Publishing: tables, plots, the append-only history, the regression verdict, JUnit XML."""
