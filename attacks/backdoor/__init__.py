"""Backdoors planted by a malicious passive party during training."""
