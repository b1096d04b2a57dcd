"""Noise-adding defenses: ISO (heuristic) and label-DP Gaussian (accounted)."""
