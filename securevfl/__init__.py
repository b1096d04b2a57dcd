"""securevfl: vertical federated learning on partially aligned data, with privacy built in and an
attack/defense lab on top."""

__version__ = "0.2.0"
