"""``splitnn`` — FedSplitNN / FedVanilla: supervised VFL on the labeled aligned rows."""

from securevfl.federation import Federation
from securevfl.methods.base import METHODS, Method, labeled_aligned_ids


@METHODS.register
class SplitNN(Method):
    name = "splitnn"
    summary = "supervised split learning on the labeled aligned rows (FedSplitNN / FedVanilla)"
    soft_label_training = True
    per_role = True
    resumable = True  # one supervised stage: its checkpoints hold everything

    def fit(self, fed: Federation) -> None:
        self.trainer = self.finetune(fed, labeled_aligned_ids(fed))
