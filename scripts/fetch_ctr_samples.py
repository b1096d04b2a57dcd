"""Fetch the real Criteo and Avazu rows that `reports/methods` measures on (issue 42).

    python scripts/fetch_ctr_samples.py            # → runs/data/criteo_sample10k.txt, avazu_sample10k.csv
    python scripts/fetch_ctr_samples.py --from-mirror DIR   # the same files from a local git clone

Neither file is vendored here: the rows belong to Criteo's and Avazu's Kaggle releases (Criteo's
Display Advertising Challenge data, Avazu's CTR Prediction data; their terms allow research use and
say nothing about redistribution), and the repository that carries these samples states no licence
of its own. The script downloads them from that public repository at a pinned commit and checks
each file's SHA-256, so every report is measured on the same bytes:

- Criteo: the first 10,000 rows of the Kaggle `train.txt` (label, I1–I13, C1–C26, tab-separated),
  `Lapis-Hong/Wide-ResDNN`, `data/sample.train` at commit 5df0e0c9.
- Avazu: 9,999 rows (the header, then 8,999 + 1,000 rows, all of hour 14102100, the file's first hour),
  the same repository's `data/avazu/train` and `data/avazu/test` at commit 094209db, concatenated
  (`test` has no header line).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import urllib.request
from pathlib import Path

REPO = "Lapis-Hong/Wide-ResDNN"
FILES: dict[str, tuple[list[tuple[str, str]], str]] = {  # name: ([(commit, path), ...], sha256)
    "criteo_sample10k.txt": ([("5df0e0c987b00fd09ae7a9952df6e82a43c166f0", "data/sample.train")],
                             "f665bb8823fd742ea1b8602d70918f235ccc08eba3224f1621c11022721c21a3"),
    "avazu_sample10k.csv": ([("094209db0b392c4c04b44ba0343aedabaa5142fc", "data/avazu/train"),
                             ("094209db0b392c4c04b44ba0343aedabaa5142fc", "data/avazu/test")],
                            "b011f531ab001af10ea0770be283777810b3cd3d84d0e240e78472045d580c2c"),
}


def part(commit: str, path: str, mirror: Path | None) -> bytes:
    if mirror is not None:
        return subprocess.run(["git", "-C", str(mirror), "show", f"{commit}:{path}"], check=True,
                              capture_output=True).stdout
    url = f"https://raw.githubusercontent.com/{REPO}/{commit}/{path}"
    with urllib.request.urlopen(url, timeout=60) as r:  # noqa: S310 (a fixed https URL)
        return r.read()


def assemble(parts: list[bytes], sha256: str, name: str) -> bytes:
    """The parts joined (each ends with a newline); a file with other bytes is refused."""
    data = b"".join(p if p.endswith(b"\n") else p + b"\n" for p in parts)
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ValueError(f"{name}: SHA-256 {got[:12]}… is not the pinned {sha256[:12]}…")
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/data"), help="folder to write into")
    ap.add_argument("--from-mirror", type=Path, help=f"a local git clone of {REPO} instead of the network")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (parts, sha) in FILES.items():
        target = args.out / name
        if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == sha:
            print(f"{target}: present")
            continue
        try:
            data = assemble([part(c, p, args.from_mirror) for c, p in parts], sha, name)
        except (OSError, ValueError, subprocess.CalledProcessError) as e:
            print(f"error: {name}: {e}", file=sys.stderr)
            return 2
        target.write_bytes(data)
        print(f"{target}: {len(data.splitlines())} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
