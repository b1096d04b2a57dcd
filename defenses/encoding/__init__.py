"""Defenses that encode before training: the labels (confusional autoencoders, KDk) or a party's
rows and deliveries (FedPass's passports)."""
