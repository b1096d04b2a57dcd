"""Defenses that limit what a representation carries (information bottleneck, decorrelation)."""
