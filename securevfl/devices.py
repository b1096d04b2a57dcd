"""Where a party's tensors live (``--device``). The run resolves the setting once
(:func:`resolve_device`) and hands the result to every party it builds; each party puts its own
models, batches and per-example gradient work there. What stays on the CPU, and why:

- cross-party messages: the channel carries bytes, encoded from CPU memory
  (:func:`securevfl.channel.codec.encode_tensor`); the receiving endpoint moves a decoded tensor to
  its own party's device on arrival (:meth:`securevfl.channel.Endpoint.recv_tensor`);
- the interactive layer and HE (securevfl/interactive.py, securevfl/crypto/): float64 numpy and
  ciphertext arithmetic on the CPU; the ends hand the plaintext result to the party's device;
- defenses' noise: drawn from a CPU ``torch.Generator`` and then moved (:func:`noise_like`). Torch
  generators are per device and a CUDA generator draws a different stream from the same seed, so
  drawing on the CPU keeps a fixed ``mechanism_seed`` reproducing the same noise on every device
  and keeps the private (OS-seeded) generators on one well-understood implementation;
- SSL augmentations (local pre-training, FedHSSL) draw on the CPU generator for the same reason; the
  views then move to the party's device;
- a malicious party's own deviations (backdoor and robustness attacks' tampering) compute on the CPU
  (:meth:`securevfl.parties.PassiveParty.send_output`);
- after training and evaluation every party moves back to the CPU (:meth:`securevfl.parties.Party.use_device`),
  so the attacks, the privacy audit and ``--save`` run on CPU tensors.
"""

from __future__ import annotations

import torch
from torch import nn

from securevfl.configuration.options import DEVICES  # noqa: E402,F401  (the values of --device; their home: the light settings module)
from securevfl.errors import UserError

CPU = torch.device("cpu")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(name: str) -> torch.device:
    """The device ``--device name`` asks for on this machine: ``auto`` is CUDA when
    ``torch.cuda.is_available()``, else MPS when available, else the CPU.

    Raises:
        UserError: ``cuda`` or ``mps`` named on a machine (or a torch build) without it."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if _mps_available() else CPU
    if name == "cuda" and not torch.cuda.is_available():
        cuda = torch.version.cuda  # type: ignore[attr-defined]  # None in a CPU-only build
        build = "built without CUDA" if cuda is None else f"CUDA {cuda} build, no GPU visible"
        raise UserError(f"--device cuda: CUDA is not available here (torch {torch.__version__}, {build}); "
                        "use --device cpu or auto")
    if name == "mps" and not _mps_available():
        raise UserError("--device mps: Apple's MPS backend is not available here; use --device cpu or auto")
    if name not in DEVICES:
        raise UserError(f"--device must be one of {', '.join(DEVICES)}, got {name!r}")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    """How the run's JSON records a device: ``cpu``, ``cuda:0`` (the GPU index the run used), ``mps``."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.current_device() if device.index is None else device.index}"
    return device.type


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s parameters (the CPU for a module without any)."""
    return next((q.device for q in module.parameters()), CPU)


def noise_like(noise: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``noise``, drawn on the CPU generator, moved to where ``like`` lives (see the module doc)."""
    return noise.to(like.device)

