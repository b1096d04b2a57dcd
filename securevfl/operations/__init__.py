"""Operating a deployment: ``securevfl doctor`` (checks before a run), ``securevfl advise`` (which
method to try first), and provenance (which code made a result)."""
