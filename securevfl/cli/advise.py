"""``securevfl advise``: the method to try first on one's own party files (securevfl/operations/advise.py)."""

from __future__ import annotations

import argparse
import json


def cmd_advise(args: argparse.Namespace) -> int:
    from securevfl.operations.advise import advise, lines, situation

    answer = advise(situation(args.party_file, args.label_column, args.id_column))
    if args.json:
        print(json.dumps(answer))
    else:
        print("\n".join(lines(answer)))
    return 0
