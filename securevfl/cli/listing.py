"""``securevfl datasets|methods|defenses|attacks``: the catalogues, from the live registries."""

from __future__ import annotations

import argparse


def cmd_datasets(args: argparse.Namespace) -> int:
    from securevfl.data import DATASETS, dataset_status
    from securevfl.data.dataset import DataConfig

    for name, ok, where in dataset_status(DataConfig(dir=args.data_dir)):
        desc = DATASETS.get(name).description
        print(f"{name:15s} {'found' if ok else 'missing':8s} {desc}\n{'':24s}{where}")
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from securevfl.configuration.catalog import METHODS  # no torch import: answers at once

    for name, summary in METHODS.items():
        print(f"{name:18s} {summary}")
    return 0


def cmd_defenses(args: argparse.Namespace) -> int:
    from defenses import DEFENSES
    from defenses.base import listing

    for name in DEFENSES.names():
        d = listing(DEFENSES.get(name))
        print(f"{name}  party: {', '.join(d['party'])}  hooks: {', '.join(d['hooks'])}  ε: {d['epsilon']}")
        print(f"  targets: {', '.join(d['targets']) or '-'}")
        for key, p in d["params"].items():
            mark = " (primary)" if key == d["primary"] else ""
            print(f"  {key} = {p['default']}{mark}: {p['range']}")
        print(f"  he: {d['he']}\n  methods: {d['methods']}\n  heads: {d['heads']}")
    return 0


def cmd_attacks(args: argparse.Namespace) -> int:
    from attacks import ATTACKS  # the catalogue is the live registry (imports torch)

    print("\n\n".join(ATTACKS.get(name).describe() for name in ATTACKS.names()))
    return 0
