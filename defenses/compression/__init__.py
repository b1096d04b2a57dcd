"""Defenses that drop information from the message: gradient sparsification."""
