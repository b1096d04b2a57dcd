"""Attacks that score the gradients a passive party received (Li et al. 2022), binary tasks."""
