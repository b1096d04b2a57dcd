#!/usr/bin/env bash
# The deployed suite N times in a row under load (issue 41): two busy loops keep both cores occupied
# while the deployed tests (tests/test_grpc.py, tests/test_roles.py) run; a hang shows as a run that hits the timeout (rc 124).
#   bash scripts/stress_deployed.sh 20      # → one line per run on stdout
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-20}
python3 -c "while True: pass" & l1=$!
python3 -c "while True: pass" & l2=$!
trap 'kill $l1 $l2 2>/dev/null' EXIT
for i in $(seq 1 "$n"); do
  start=$(date +%s)
  out=$(timeout 900 python -m pytest -q -p no:cacheprovider tests/test_grpc.py tests/test_roles.py 2>&1 | tail -1)
  rc=$?  # pipefail: pytest's (or timeout's 124) status
  echo "run $i rc=${rc} seconds=$(( $(date +%s) - start )) ${out}"
done
