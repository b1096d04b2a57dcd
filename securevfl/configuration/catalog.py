"""Names of the registered methods (with one-line summaries) and datasets, readable without
importing torch, so ``securevfl methods`` answers at once and a misspelt name fails at once. Generated from the registry; tests/test_cli.py checks it still
matches (regenerate with ``python -c "from securevfl.configuration.catalog import render; print(render())"``)."""

from __future__ import annotations

METHODS: dict[str, str] = {
    'entity-aug': 'no alignment in training: guests send their own entities, the host trains on weighted soft labels',
    'fedcssl': 'FedHSSL ablation: cross-party SSL only; fine-tunes f_c',
    'fedgssl': 'FedHSSL ablation: cross-party + guided local SSL, no partial model aggregation',
    'fedhssl': 'cross-party SSL + guided local SSL + partial model aggregation, then fine-tuning (FedHSSL)',
    'fedlocal-byol': 'each party pre-trains alone with BYOL on all its rows, then split-learning fine-tuning',
    'fedlocal-moco': 'each party pre-trains alone with MoCo on all its rows, then split-learning fine-tuning',
    'fedlocal-scarf': 'each party pre-trains alone with SCARF on all its rows, then split-learning fine-tuning',
    'fedlocal-simsiam': 'each party pre-trains alone with SimSiam on all its rows, then split-learning fine-tuning',
    'fedud': "host's unaligned rows via a representation-transfer net distilled from the guest (FedUD)",
    'local': 'active party alone on all its labeled local rows (Local-A baseline)',
    'local-vfl': "RISA baseline Local+VFL: the active party's non-overlapping rows with zero-imputed passive blocks",
    'random-match': "RISA baseline Random Match: the active party's non-overlapping rows paired with random passive rows",
    'risa': 'mean imputation + self-training + evidential VFL with uncertainty-based row selection (RISA)',
    'splitnn': 'supervised split learning on the labeled aligned rows (FedSplitNN / FedVanilla)',
    'vflhlp': 'active supervised pre-training as a constraint + passive SCARF initialisation (VFLHLP)',
    'vflhlp-a': "VFLHLP ablation: only the active party's pre-trained constraint",
    'vflhlp-p': "VFLHLP ablation: only the passive parties' SCARF initialisation",
}


DATASETS: tuple[str, ...] = ('avazu', 'breast-cancer', 'criteo', 'csv', 'digits', 'fashion-mnist', 'mnist', 'uci-credit')

ATTACKS: tuple[str, ...] = ('backdoor-gr', 'backdoor-villain', 'bli', 'cluster', 'direction', 'dli', 'fr', 'fr-grn', 'fr-init', 'fsha', 'mc', 'mc-active', 'mc-full', 'mc-plain', 'missing-feature', 'noisy-sample', 'norm', 'sdar', 'sdar-label', 'sign-probe')

DEFENSES: tuple[str, ...] = ('cae', 'dcae', 'dcor', 'discrete-sgd', 'dp', 'embedding-dp', 'fedpass', 'gradient-guard', 'gradperturb', 'iso', 'kdk', 'laplace', 'marvell', 'max-norm', 'mid', 'noise', 'peloss', 'rr', 'sparsify')


def check_names(dataset: str | None, method: str | None) -> None:
    """Fail fast on an unknown dataset or method name (the registries say the same, later)."""
    from securevfl.errors import UserError

    if dataset is not None and dataset not in DATASETS:
        raise UserError(f"unknown dataset {dataset!r}; available: {', '.join(sorted(DATASETS))}")
    if method is not None and method not in METHODS:
        raise UserError(f"unknown method {method!r}; available: {', '.join(sorted(METHODS))}")


# ATTACKS and DEFENSES are the attack and defense registries' names (tests/test_cli.py checks them; the
# core does not import those packages, so they are kept here by hand)


def check_component_names(attacks: list, defense: str | None) -> None:
    """Fail fast on an unknown attack or defense name in ``--attack`` / ``--defense`` (their parameters are
    checked by the registries, later): a typo is answered before torch is imported."""
    from securevfl.errors import UserError

    for entry in attacks:
        name = next(iter(entry)) if isinstance(entry, dict) and len(entry) == 1 else entry
        if isinstance(name, str) and name.split(":", 1)[0].strip() not in ATTACKS:
            raise UserError(f"unknown attack {name.split(':', 1)[0].strip()!r}; available: {', '.join(ATTACKS)}")
    for part in (defense or "").split("+"):
        name = part.split(":", 1)[0].strip()
        if name and name != "none" and name not in DEFENSES:
            raise UserError(f"unknown defense {name!r}; available: {', '.join(DEFENSES)}")


def render() -> str:
    """This module's dict as it should read for the live registry (imports every method)."""
    from securevfl.data import DATASETS as dataset_registry
    from securevfl.methods import METHODS as method_registry

    body = "".join(f"    {n!r}: {method_registry.get(n).summary!r},\n" for n in method_registry.names())
    return ("METHODS: dict[str, str] = {\n" + body + "}\n\nDATASETS: tuple[str, ...] = "
            + repr(tuple(dataset_registry.names())))
