"""Self-supervised building blocks shared by every method that needs them (FedLocalSSL, FedHSSL,
VFLHLP's passive SCARF pre-training, the MC attack's local-SSL baseline): augmentations, one
implementation each of SimSiam / BYOL / MoCo / SCARF, and a party-local pre-training loop."""

from securevfl.ssl.augment import Augmentation, make_augmentation
from securevfl.ssl.local import pretrain_local
from securevfl.ssl.objectives import OBJECTIVES, SSLConfig, SSLObjective, make_objective, neg_cosine

__all__ = ["OBJECTIVES", "Augmentation", "SSLConfig", "SSLObjective", "make_augmentation", "make_objective",
           "neg_cosine", "pretrain_local"]
