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
    per_role = True

    def fit(self, fed: Federation) -> None:
        label_ids = fed.active.data.label_ids
        assert label_ids is not None  # the active party's data always carries its labels
        self.trainer = self.finetune(fed, label_ids)
