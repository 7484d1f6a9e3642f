"""A TCP port for a job's rendezvous (MASTER_PORT) on this host, the one place one is picked.

A port taken from the kernel with bind(port 0) is one of the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range,
32768-60999 here), the range every outgoing connection also takes its local port from: between the pick and the
launcher's listen, any connection on the host (gloo's mesh between the ranks of another job, a download) can take it,
and the job dies with "cannot listen on MASTER_ADDR=127.0.0.1 MASTER_PORT=41121: Address already in use" (a CI of
076044b, beside the GPU check's runs). `free_port` picks at random below that range, where only an explicit bind
competes, and checks that nothing listens there now."""
from __future__ import annotations

import random
import socket

LOWEST = 20000  # below it, the ports of well-known services


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections and bind(0); Linux's default where it cannot be read."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port below the ephemeral range that nothing listens on now (at random, so that jobs started at once differ);
    the kernel's pick where that range leaves too little room below it."""
    low, _ = ephemeral_range()
    if low - LOWEST >= 1000:
        for _ in range(tries):
            port = random.randrange(LOWEST, low)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
