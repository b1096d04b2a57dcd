"""Parties on separate network stacks (issue 53): the active and the passive party in two network
namespaces joined by a veth pair (scripts/netns_pair.sh), each on its own address, no loopback between
them; the deployed run equals the in-process one. Needs root (``ip netns``); skipped otherwise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "deploy-example"
SCRIPT = ROOT / "scripts" / "netns_pair.sh"


@pytest.fixture()
def namespaces():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    name = f"sv{os.getpid() % 100000}"
    up = subprocess.run(["bash", str(SCRIPT), "up", name], capture_output=True, text=True)
    if up.returncode != 0:
        subprocess.run(["bash", str(SCRIPT), "down", name], capture_output=True)
        pytest.skip(f"cannot create network namespaces here: {up.stderr.strip()}")
    try:
        yield f"{name}-a", f"{name}-p"
    finally:
        subprocess.run(["bash", str(SCRIPT), "down", name], capture_output=True)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_parties_on_separate_network_stacks_equal_in_process(namespaces, tmp_path) -> None:
    ns_a, ns_p = namespaces
    certs = tmp_path / "certs"
    subprocess.run([sys.executable, "-m", "securevfl", "certs", "--parties", "active,passive1", "--out", str(certs)],
                   check=True, env=_env(), capture_output=True)
    log = tmp_path / "passive.log"
    with open(log, "w") as err:
        passive = subprocess.Popen(["ip", "netns", "exec", ns_p, sys.executable, "-m", "securevfl", "party",
                                    "--role", "passive1", "--listen", "10.200.0.2:50051", "--party-file",
                                    str(EXAMPLE / "breast_hetero_host.csv"), "--tls", str(certs / "passive1"),
                                    "--seed", "77", "--timeout", "60"], env=_env(), stderr=err,
                                   stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in log.read_text():
            assert passive.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        # separate stacks: from the active party's namespace the passive party is at its own address only
        probe = "import socket, sys; socket.create_connection((sys.argv[1], 50051), 2).close()"
        for addr, reachable in (("10.200.0.2", True), ("127.0.0.1", False)):
            r = subprocess.run(["ip", "netns", "exec", ns_a, sys.executable, "-c", probe, addr], capture_output=True)
            assert (r.returncode == 0) == reachable, addr
        common = ["--dataset", "csv", "--label-column", "y", "--epochs", "2", "--seed", "3", "--json", "--quiet"]
        deployed = subprocess.run(["ip", "netns", "exec", ns_a, sys.executable, "-m", "securevfl", "train", *common,
                                   "--party-file", str(EXAMPLE / "breast_hetero_guest.csv"),
                                   "--peer", "passive1=10.200.0.2:50051", "--tls", str(certs / "active")],
                                  env=_env(), capture_output=True, text=True, timeout=300)
        assert deployed.returncode == 0, deployed.stderr
        passive.wait(timeout=60)
        assert passive.returncode == 0, log.read_text()
    finally:
        if passive.poll() is None:
            passive.kill()
    here = subprocess.run([sys.executable, "-m", "securevfl", "train", *common, "--passive-seed", "77",
                           "--party-file", str(EXAMPLE / "breast_hetero_guest.csv"),
                           "--party-file", str(EXAMPLE / "breast_hetero_host.csv")],
                          env=_env(), capture_output=True, text=True, timeout=300, check=True)
    dep, sim = json.loads(deployed.stdout), json.loads(here.stdout)
    assert dep["utility"] == sim["utility"]  # bit for bit: the same programs, the same seeds
    assert dep["transport"]["peers"] == {"passive1": "10.200.0.2:50051"}
    assert dep["transport"]["security"] == "mutual TLS"


def test_a_name_in_use_is_refused_with_one_line(namespaces) -> None:
    """Issue 61: a second ``up`` of a name in use (another user's pair) says so and exits 2; the
    control: another name comes up."""
    name = namespaces[0][:-2]
    again = subprocess.run(["bash", str(SCRIPT), "up", name], capture_output=True, text=True)
    assert again.returncode == 2 and again.stderr.startswith("error: namespace") and "exists already" in again.stderr
    other = f"{name}x"
    try:
        ok = subprocess.run(["bash", str(SCRIPT), "up", other], capture_output=True, text=True)
        assert ok.returncode == 0, ok.stderr
    finally:
        subprocess.run(["bash", str(SCRIPT), "down", other], capture_output=True)
