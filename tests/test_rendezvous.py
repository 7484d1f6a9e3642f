"""Where a job listens: never on every interface (docs/RELIABILITY.md, hostile input)."""
from __future__ import annotations

import ipaddress

import psutil
import pytest

from tests.parallel_jobs import listening_sockets


def _loopback(ip: str) -> bool:
    return ipaddress.ip_address(ip).is_loopback


def test_single_process_opens_no_rendezvous_server_and_nothing_beyond_loopback(workers):
    (out,) = workers.run(1, listening_sockets)
    assert all(_loopback(ip) for ip, _ in out["listening"]), out
    assert out["master_port"] not in [port for _, port in out["listening"]], "a one-process run needs no store server"


def test_a_job_on_one_host_listens_on_loopback_only(workers):
    out = workers.run(2, listening_sockets)
    assert all(_loopback(ip) for r in out for ip, _ in r["listening"]), out
    rank0 = out[0]
    assert ("127.0.0.1", rank0["master_port"]) in rank0["listening"], "the store server is rank 0's, on MASTER_ADDR"


def _external_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not _loopback(a.address):
                return a.address
    return None


def test_a_multi_node_store_listens_where_master_addr_says(workers):
    addr = _external_ipv4()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    out = workers.run(2, listening_sockets, addr)
    rank0 = out[0]
    store = [ip for ip, port in rank0["listening"] if port == rank0["master_port"]]
    assert store == [addr], rank0  # not 0.0.0.0 / :: (torch's TCPStore server alone would bind every interface)
