"""A served party's own privacy settings, and how they meet the run description the active party sends.

Every setting that protects a passive party's data is that party's own decision (``securevfl party
--defense/--mechanism-seed/--he/--he-param/--interactive-mixing``). The active party's description
may *ask* for settings; :func:`reconcile` decides, as a pure function of the description and the
party's own settings, what the party runs with:

- **mechanism seed**: only the party's own ``--mechanism-seed`` fixes its noise. A seed in the
  description that is not the party's own is refused: with it the active party could regenerate the
  very noise that hides this party's features from it.
- **defenses that run at this party** (feature DP, dCor, the passive side of Laplace): with its own
  ``--defense`` the party runs its own and ignores what the description asks for them (said on
  stderr); without, it runs what the description asks (said on stderr: the active party chose them).
  Defenses that run at the active party are the active party's business and pass through.
- **HE scheme, HE parameters, interactive mixing**: both sides must run the same protocol, so what the
  party set itself is a requirement: a description that differs is refused.
- **HE test fixtures** (``seeded_shares``) are refused whatever the party set.

- **bottom model, optimiser, learning rates, columns** (securevfl/passive_own.py, issue 60): the
  party's own (``party --config party.yaml``); a description that asks for other values is refused,
  and the party builds from its own.

Whatever is left weak (no HE, no defense at this party, mixing off, a fixed seed) is listed in the
returned notes, which the party prints before any data moves.

:func:`admit` then applies the party's **policy** (issue 54), also before any byte of data leaves:
the alignment it requires (PSI unless ``--allow plain-alignment``), the methods it accepts
(``--methods``), the permissions a method's operations need (``--allow unaligned-ids``: RISA,
random-match and Local+VFL announce the IDs of its rows outside the intersection; ``--allow reinit``:
FedUD's re-initialisation), the largest batch (``--max-batch-size``) and bottom model
(``--max-parameters``) it serves. A refusal is one line on both sides; an accepted revealing setting
is one note on this side."""

from __future__ import annotations

from dataclasses import dataclass, field

from securevfl.configuration.options import ModelConfig
from securevfl.errors import UserError
from securevfl.passive_own import PassiveOwn, check_asked, is_linear, merged

PASSIVE = "passive"


@dataclass
class PartySettings:
    """What a served passive party decided for itself (the flags of ``securevfl party``)."""

    defense: str | None = None
    """Its own defenses (``--defense``); only those that run at a passive party are allowed. None: run
    what the active party asks for."""
    mechanism_seed: int | None = None
    """A fixed seed for its own mechanisms (``--mechanism-seed``): tests and debugging only."""
    he: str | None = None
    """The HE scheme it requires (``--he``); None: whatever the run uses (a note if off)."""
    he_params: dict = field(default_factory=dict)
    """HE parameters it requires, e.g. ``mask_bits=40`` (``--he-param``)."""
    interactive_mixing: str | None = None
    """The interactive layer's mixing it requires (``--interactive-mixing``)."""
    seed: int | None = None
    """Its own seed (``--seed``): its initial weights and every draw it makes alone. None (default):
    fresh from the OS for each run. The active party never learns it."""
    allow: frozenset[str] = frozenset()
    """What it lets a run do beyond the default (``--allow``, :data:`PERMISSIONS`)."""
    methods: tuple[str, ...] | None = None
    """The methods it takes part in (``--methods``); None: every method that runs across processes."""
    max_batch_size: int = 4096
    """The largest batch of rows it answers (``--max-batch-size``); the default covers the default
    inference batch (2,048)."""
    max_parameters: int = 50_000_000
    """The largest bottom model it builds, in parameters (``--max-parameters``): 200 MB of weights."""
    max_requests: int = 100_000_000
    """The most requests it answers in one run (``--max-requests``)."""
    max_rate: float = 5000.0
    """Requests per second it answers at most (``--max-rate``; more wait); 0: no limit."""
    model: PassiveOwn = field(default_factory=PassiveOwn)
    """Its own bottom model, optimiser, learning rates and columns (``party --config party.yaml`` and
    flags, securevfl/passive_own.py): a run that asks for others is refused (issue 60)."""
    max_lr: float = 1.0
    """The largest learning rate the active party may set on it (``--max-lr``)."""
    min_batch_fraction: float = 0.25
    """Training batches below this share of the run's batch size are refused unless they end an epoch
    (``--min-batch-fraction``; 0: any size)."""
    expect_settings: str | None = None
    """The digest of the run settings this party agreed to out of band (``--expect-settings``, as
    ``securevfl doctor train`` prints it): a run whose description has another digest is refused before
    any data moves. None: any settings its policy admits."""


DIGEST_HEX = 16
_NOT_SETTINGS = ("party", "index", "resume_epoch", "checkpoint")  # per party, or per start of the same run


def settings_digest(hello: dict) -> str:
    """The digest of what a run description asks, the same for every passive party of the run and on a
    resume: the method, model, optimiser, training, data options, seed, defenses, HE and alignment, as
    canonical JSON, SHA-256, the first :data:`DIGEST_HEX` hex digits."""
    import hashlib
    import json

    body = {k: v for k, v in hello.items() if k not in _NOT_SETTINGS}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()
                          ).hexdigest()[:DIGEST_HEX]


PERMISSIONS = {
    "plain-alignment": "align by sending this party's ID list in the clear (--alignment plain)",
    "unaligned-ids": "announce the IDs of this party's rows outside the intersection (risa, random-match, local-vfl)",
    "reinit": "re-initialise this party's weights mid-run, from its own seed (fedud reinit: true)",
    "linear-bottom": "serve a bottom model with no hidden non-linearity (no hidden layer, or cut 1): a linear map "
                     "of its features",
}
"""What ``party --allow`` can permit, and what each reveals or does."""


def _split(spec: str | None) -> list[str]:
    if spec is None or spec.strip() in ("", "none"):
        return []
    return [p.strip() for p in spec.split("+")]


def _runs_here(part: str) -> bool:
    """Whether the defense named by the spec part runs at a passive party."""
    from defenses import DEFENSES  # the registry (imports torch): only when a run starts
    from securevfl.configuration.spec import split_name

    return PASSIVE in DEFENSES.get(split_name(part)[0]).runs_at


def check_own(own: PartySettings) -> None:
    """The party's own settings make sense on their own (before it listens).

    Raises:
        UserError: a defense of the active party's in its own ``--defense``, or a test fixture."""
    from defenses import parse_defense
    from securevfl.cutlayer import refuse_test_fixtures

    parse_defense(own.defense)  # names and parameters, with the defenses' own checks
    for part in _split(own.defense):
        if not _runs_here(part):
            raise UserError(f"--defense {part}: runs at the active party; a passive party's --defense names the "
                            "defenses it runs itself (e.g. embedding-dp, dcor)")
    refuse_test_fixtures(own.he_params, "--he-param")
    if is_linear(own.model.model) and "linear-bottom" not in own.allow:
        raise UserError("this party's bottom model has no hidden non-linearity (no hidden layer, or cut 1): its "
                        "output is a linear map of its features; give it hidden layers, or allow it with --allow "
                        "linear-bottom")


def reconcile(hello: dict, own: PartySettings) -> tuple[dict, list[str]]:
    """The run description this party runs with, and the notes it prints.

    Args:
        hello: the active party's run description (``deploy.run_description``).
        own: this party's own settings.
    Returns:
        (the description with this party's decisions in place, notes for stderr).
    Raises:
        UserError: a setting asked for that this party refuses (one line, sent to the active party too)."""
    from securevfl.interactive import mixing_for  # (torch: the party's flags are checked before it)

    notes: list[str] = []
    if own.expect_settings is not None and (got := settings_digest(hello)) != own.expect_settings:
        raise UserError(f"the active party's run settings have digest {got}; this party agreed to "
                        f"{own.expect_settings} (--expect-settings); refused (securevfl doctor train prints a run's "
                        "digest)")
    check_asked(hello, own.model)  # its bottom model, optimiser, rates and columns are its own
    hello = merged(hello, own.model)
    if any(str(k).replace("-", "_") == "seeded_shares" for k in hello.get("he_params", {})):
        # a test fixture: this party's HE share and masks would follow from the public seed
        raise UserError("the active party asked for HE seeded_shares, which would let it derive this party's "
                        "secret share; refused")
    asked = _split(hello.get("defense"))
    theirs = [p for p in asked if not _runs_here(p)]
    here_asked = [p for p in asked if _runs_here(p)]
    if own.defense is not None:
        here = _split(own.defense)
        if here_asked != here:
            notes.append(f"the active party asked this party to run {'+'.join(here_asked) or 'no defense'}; it runs "
                         f"its own --defense {'+'.join(here) or 'none'} instead")
        hello["defense"] = "+".join(theirs + here) or "none"  # (the order seeds each part: unchanged if not overridden)
    else:
        here = here_asked
        if here:
            notes.append(f"running the defense the active party chose for this party: {'+'.join(here)} (set your own "
                         "with --defense)")

    asked_seed = hello.get("mechanism_seed")
    if asked_seed is not None and asked_seed != own.mechanism_seed and here:
        raise UserError(f"the active party asked for a fixed mechanism seed ({asked_seed}), which would let it "
                        "regenerate the noise of this party's defense; refused (only this party's own "
                        "--mechanism-seed fixes its noise)")
    hello["mechanism_seed"] = own.mechanism_seed  # (with no defense here, the active party's seed seeds nothing here)
    if own.mechanism_seed is not None:
        notes.append(f"--mechanism-seed {own.mechanism_seed}: this party's noise is reproducible by anyone who knows "
                     "the seed (tests only; the run is not private)")
    if not here:
        notes.append("no defense runs at this party: its activations carry its features as the model learns them")
    scheme = hello.get("he", "off")
    if own.he is not None and scheme != own.he:
        raise UserError(f"the active party asked for --he {scheme}; this party requires --he {own.he}; refused")
    for key, want in own.he_params.items():
        got = hello.get("he_params", {}).get(key)
        if got != want:
            raise UserError(f"the active party asked for --he-param {key}={got!r}; this party requires {key}={want!r}; "
                            "refused")
    asked_mixing = hello.get("model", {}).get("interactive_mixing", "auto")
    mixing = mixing_for(asked_mixing, scheme)  # "auto" compared as what it resolves to (on under HE)
    if own.interactive_mixing is not None and mixing != mixing_for(own.interactive_mixing, scheme):
        raise UserError(f"the active party asked for --interactive-mixing {asked_mixing}; this party requires "
                        f"{own.interactive_mixing}; refused")
    if scheme == "off":
        notes.append("--he off: the active party receives this party's activations in the clear")
    elif mixing == "off":
        notes.append("--interactive-mixing off: the active party learns more of this party's activations from the "
                     "encrypted layer (docs/he-protocol.md)")
    return hello, notes


def admit(hello: dict, own: PartySettings, method: object | None) -> list[str]:
    """This party's policy on the (reconciled) run description ``hello`` and its ``method``, before
    any data moves: every path goes through it (a training run, a scoring run with ``method`` None,
    the doctor's verdict).

    Returns:
        Notes for stderr (each setting accepted that reveals something).
    Raises:
        UserError: a run the policy refuses (one line, sent to the active party too)."""
    notes: list[str] = []
    name = str(hello.get("method", "splitnn"))
    if own.methods is not None and name not in own.methods:
        raise UserError(f"the active party asked for method {name}; this party takes part in {', '.join(own.methods)} "
                        "only (--methods); refused")
    if hello.get("alignment") == "plain":
        if "plain-alignment" not in own.allow:
            raise UserError("the active party asked for plain alignment, which sends this party's IDs in the clear; "
                            "refused (this party aligns by PSI; allow it with --allow plain-alignment)")
        notes.append("--allow plain-alignment: this party sends all its IDs to the active party in the clear")
    if method is None:  # a scoring run (predict --peer): no training, no method operations
        return notes
    needs: frozenset[str] = getattr(method, "permissions_needed", frozenset)()
    for need in sorted(needs):
        if need not in own.allow:
            raise UserError(f"method {name} as configured needs this party to {PERMISSIONS[need]}; refused (allow "
                            f"it with --allow {need})")
        notes.append(f"--allow {need}: method {name} makes this party {PERMISSIONS[need]}")
    if is_linear(_model(hello)) and "linear-bottom" not in own.allow:  # (reconcile put its own model there)
        raise UserError("the run's bottom model at this party has no hidden non-linearity; refused (allow it with "
                        "--allow linear-bottom)")
    train = hello.get("train", {})
    for key in ("batch_size", "eval_batch_size"):
        size = train.get(key)
        if isinstance(size, int) and size > own.max_batch_size:
            raise UserError(f"the active party asked for {key} {size}; this party serves at most {own.max_batch_size} "
                            "rows a batch (--max-batch-size); refused")
    return notes


def check_model_size(n_parameters: int, own: PartySettings) -> None:
    """The bottom model the run description asks for fits this party's ``--max-parameters`` (counted
    before any weight is allocated)."""
    if n_parameters > own.max_parameters:
        raise UserError(f"the active party asked for a bottom model of {n_parameters:,} parameters; this party "
                        f"builds at most {own.max_parameters:,} (--max-parameters); refused")


def _model(hello: dict) -> ModelConfig:
    m = hello.get("model") or {}
    return ModelConfig(bottom=m.get("bottom", "auto"), hidden=tuple(m.get("hidden") or ()), cut=m.get("cut"))
