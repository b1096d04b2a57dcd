"""``local`` — Local-A / DNN: the active party alone on all its labeled rows.

Uses the same trainer with no passive parties, so the head sees only r^1 and nothing crosses the
channel."""

from securevfl.federation import Federation
from securevfl.methods.base import METHODS, Method


@METHODS.register
class Local(Method):
    name = "local"
    summary = "active party alone on all its labeled local rows (Local-A baseline)"
    uses_passives = False
    sends = frozenset()

    def fit(self, fed: Federation) -> None:
        self.trainer = self.finetune(fed, fed.active.data.label_ids)
