"""What a party keeps on disk: its checkpoints, saved models, spilled per-row arrays, new files made
safely, and its recorded view of a deployed run."""
