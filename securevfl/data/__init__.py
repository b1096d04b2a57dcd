"""Datasets, the VFL partition and PSI alignment."""

from securevfl.data import builtin, credit, csvsource, ctr  # noqa: F401  (registration)
from securevfl.data.dataset import DataConfig, Dataset
from securevfl.data.partition import Partition, PartitionSpec, PartyData, make_partition, party_names
from securevfl.data.registry import dataset_names, dataset_status, get_dataset_entry, load_dataset

__all__ = ["DataConfig", "Dataset", "Partition", "PartitionSpec", "PartyData", "dataset_names", "dataset_status",
           "get_dataset_entry", "load_dataset", "make_partition", "party_names"]
