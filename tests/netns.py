"""Two network namespaces joined by a veth pair: two "nodes" on one machine that can only reach
each other over TCP between distinct addresses (tests/test_netns.py).

Both namespaces share this machine's mount and PID namespaces (/dev/shm, /proc), so the
ranks in them need distinct SHMCOLL_HOSTIDs to form two nodes. Everything is named after
this process's pid, so concurrent test runs do not collide, and removing a namespace
removes its end of the veth pair (and with it the other end).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import NamedTuple

ADDRESSES = ("10.77.0.1", "10.77.0.2")  # one /24, a veth end each


class NetnsUnavailable(Exception):
    """Network namespaces cannot be made here; the message says why (with the command's stderr)."""


class NetnsPair(NamedTuple):
    namespaces: tuple[str, str]
    interfaces: tuple[str, str]  # the veth end in each namespace
    addresses: tuple[str, str]

    def exec_prefix(self, node: int) -> list[str]:
        """Command prefix that runs a program inside namespace ``node``."""
        return ["ip", "netns", "exec", self.namespaces[node]]

    def counters(self, node: int) -> dict[str, int]:
        """rx/tx byte counters of the veth end in namespace ``node`` (sysfs as that namespace sees it)."""
        folder = f"/sys/class/net/{self.interfaces[node]}/statistics"
        out = _run([*self.exec_prefix(node), "cat", f"{folder}/rx_bytes", f"{folder}/tx_bytes"]).split()
        return {"rx_bytes": int(out[0]), "tx_bytes": int(out[1])}


def _run(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise NetnsUnavailable(f"`{' '.join(command)}` failed (exit {result.returncode}): "
                               f"{result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def make_pair() -> NetnsPair:
    """Create the namespaces, the veth pair (10.77.0.1 and 10.77.0.2) and bring every link up."""
    if os.geteuid() != 0:
        raise NetnsUnavailable(f"network namespaces need root (CAP_NET_ADMIN); running as uid {os.geteuid()}")
    if shutil.which("ip") is None:
        raise NetnsUnavailable("the `ip` command (iproute2) is not installed")
    pid = os.getpid()
    # Interface names have at most 15 characters: "shmc" + a pid (at most 7 digits) + a letter.
    pair = NetnsPair((f"shmcoll-{pid}-0", f"shmcoll-{pid}-1"), (f"shmc{pid}a", f"shmc{pid}b"), ADDRESSES)
    try:
        for ns in pair.namespaces:
            _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", pair.interfaces[0], "netns", pair.namespaces[0], "type", "veth",
              "peer", "name", pair.interfaces[1], "netns", pair.namespaces[1]])
        for ns, interface, address in zip(pair.namespaces, pair.interfaces, pair.addresses):
            _run(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", interface])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "link", "set", interface, "up"])
    except BaseException:
        remove_pair(pair)
        raise
    return pair


def shape(pair: NetnsPair, rate: str | None) -> None:
    """Give the link a bandwidth (tc's units, e.g. "1gbit"): a veth moves bytes at memory speed.

    A token bucket on each end, since a qdisc shapes only what leaves its interface (one
    direction each). None or "unshaped": no qdisc.
    """
    if rate is None or rate == "unshaped":
        return
    for node, interface in enumerate(pair.interfaces):
        _run([*pair.exec_prefix(node), "tc", "qdisc", "add", "dev", interface, "root", "tbf",
              "rate", rate, "burst", "256kb", "latency", "100ms"])


def remove_pair(pair: NetnsPair) -> None:
    """Delete both namespaces (and so the veth pair); quiet about what was never made."""
    for ns in pair.namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def leftover_namespaces(pair: NetnsPair) -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    present = {line.split()[0] for line in listing.splitlines() if line.strip()}
    return [ns for ns in pair.namespaces if ns in present]
