"""Defenses that encode the labels before they touch training (confusional autoencoders)."""
