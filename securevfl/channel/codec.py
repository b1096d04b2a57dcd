"""Wire format for everything that crosses a party boundary.

Tensors: ``<B dtype code><B ndim><ndim × uint32 shape>`` then the raw little-endian buffer, so a
float32 tensor of shape (B, d) costs exactly ``2 + 4·2 + 4·B·d`` bytes (see :func:`tensor_nbytes`).
Entity IDs travel as an int64 tensor when they are integers, otherwise as a JSON list of strings
behind a one-byte tag. A batch request (the control message before a batch's IDs) is one JSON
integer, ``2 · split index + training flag``.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import torch

_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"),
    2: np.dtype("<f8"),
    3: np.dtype("<i8"),
    4: np.dtype("<i4"),
    5: np.dtype("u1"),
    6: np.dtype("<f2"),
}
_CODES = {dt: code for code, dt in _DTYPES.items()}
_STR_IDS = 255


def tensor_nbytes(shape: tuple[int, ...], itemsize: int = 4) -> int:
    """Encoded size of a tensor message: header (2 + 4·ndim) plus the raw buffer."""
    return 2 + 4 * len(shape) + int(np.prod(shape, dtype=np.int64)) * itemsize


def encode_array(a: np.ndarray) -> bytes:
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    code = _CODES.get(np.dtype(dt))
    if code is None:
        raise TypeError(f"cannot send arrays of dtype {a.dtype}")
    a = np.ascontiguousarray(a, dtype=_DTYPES[code])
    return struct.pack(f"<BB{a.ndim}I", code, a.ndim, *a.shape) + a.tobytes()


def decode_array(buf: bytes) -> np.ndarray:
    code, ndim = struct.unpack_from("<BB", buf, 0)
    if code not in _DTYPES:
        raise ValueError(f"not an array message (dtype code {code})")
    shape = struct.unpack_from(f"<{ndim}I", buf, 2)
    return np.frombuffer(buf, dtype=_DTYPES[code], offset=2 + 4 * ndim).reshape(shape)


def encode_tensor(t: torch.Tensor) -> bytes:
    return encode_array(t.detach().cpu().numpy())


def decode_tensor(buf: bytes) -> torch.Tensor:
    # copy: frombuffer views are read-only and torch wants writable storage
    return torch.from_numpy(decode_array(buf).copy())


ID_PART = 1 << 20
"""An integer ID list longer than this travels as a head (``_ID_PARTS``, the count) and parts of at most
this many IDs each: neither side holds the whole list as one message (a million-row party's memory)."""
_ID_PARTS = 254
MAX_IDS = 1 << 36


def id_parts_head(n: int) -> bytes:
    return struct.pack("<BQ", _ID_PARTS, n)


def parts_of(buf: bytes) -> int | None:
    """The count an ID-list head announces (``None``: a whole list)."""
    if len(buf) != 9 or buf[0] != _ID_PARTS:
        return None
    n = int(struct.unpack_from("<Q", buf, 1)[0])
    if n > MAX_IDS:
        raise ValueError(f"an ID list of {n} IDs announced (more than {MAX_IDS})")
    return n


def encode_ids(ids: np.ndarray) -> bytes:
    ids = np.asarray(ids)
    if ids.dtype.kind in "iu":
        return encode_array(ids.astype(np.int64))
    return bytes([_STR_IDS]) + json.dumps([str(i) for i in ids]).encode()


def decode_ids(buf: bytes) -> np.ndarray:
    if buf[0] == _STR_IDS:
        return np.array(json.loads(buf[1:].decode()), dtype=object)
    return decode_array(buf).copy()


def encode_json(obj: object) -> bytes:
    """``obj`` as JSON, every finite float written at a fixed width (:func:`_fixed_float`): a message's
    length never depends on the last bits of a value a training loop computed, which differ between
    CPU kernels (issue 51: a golden run's byte counts moved with the CPU)."""
    if type(obj) is int:  # the per-step control message: same bytes as json.dumps, without its machinery
        return str(obj).encode()
    floats: list[float] = []
    text = json.dumps(_mark_floats(obj, floats), sort_keys=True)
    for i, x in enumerate(floats):
        text = text.replace(f'"\\u0000{i}\\u0000"', _fixed_float(x), 1)
    return text.encode()


def _fixed_float(x: float) -> str:
    """A float as a JSON number of fixed width that decodes to the same float: 17 significant digits
    in exponent form, a space where a minus sign would be (JSON allows space before a value)."""
    if x != x or x in (float("inf"), float("-inf")):
        return json.dumps(x)
    text = f"{x:.16e}"
    return text if text.startswith("-") else " " + text


def _mark_floats(obj: object, floats: list[float]) -> object:
    """``obj`` with each float replaced by a marker string that :func:`encode_json` swaps back."""
    if isinstance(obj, float):  # numpy's float64 too
        floats.append(float(obj))
        return f"\x00{len(floats) - 1}\x00"
    if isinstance(obj, dict):
        return {k: _mark_floats(v, floats) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_mark_floats(v, floats) for v in obj]
    return obj


def decode_json(buf: bytes) -> object:
    return json.loads(buf.decode())


_SPLITS = ("train", "test")  # a batch request's split, by its index in the control code


def encode_batch_request(split: str, training: bool) -> bytes:
    """The control message asking a passive party for its bottom output on the next batch of IDs.

    Args:
        split: ``"train"`` or ``"test"``: which of its rows the IDs name.
        training: whether the step trains (the passive party keeps its output for the gradient).

    Returns:
        the JSON integer ``2 · split index + training``.
    """
    return encode_json(_SPLITS.index(split) * 2 + int(training))


def decode_batch_request(buf: bytes) -> tuple[str, bool]:
    """Inverse of :func:`encode_batch_request`: ``(split, training)``; ``ValueError`` when ``buf`` is
    not a batch request (another control message, such as entity-aug's batch size)."""
    code = decode_json(buf)
    if type(code) is not int or not 0 <= code < 2 * len(_SPLITS):
        raise ValueError(f"not a batch request: {code!r}")
    return _SPLITS[code // 2], bool(code % 2)
