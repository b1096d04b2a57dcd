"""Datasets, the VFL partition and PSI alignment."""

from securevfl.data import builtin, credit, csvsource, ctr  # noqa: F401  (registration)
from securevfl.data.dataset import DataConfig, Dataset
from securevfl.data.partition import Partition, PartitionSpec, PartyData, make_partition, party_names
from securevfl.data.registry import DATASETS, dataset_status, load_dataset

__all__ = ["DataConfig", "Dataset", "Partition", "PartitionSpec", "PartyData", "DATASETS", "dataset_status",
           "load_dataset", "make_partition", "party_names"]
