"""Noise-adding defenses: ISO (heuristic), label-DP by DP-SGD and by randomized response (accounted)."""
