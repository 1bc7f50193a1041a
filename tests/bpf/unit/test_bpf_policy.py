"""QoS policy specs for `mcpctl bpf attach`: DSCP values from mcp26.mesh.qos, clear errors."""
import argparse
import ipaddress

import pytest

from mcp26.bpf import cli, layout
from mcp26.bpf.policy import PolicyError, build_policy, parse_dscp
from mcp26.mesh.qos import ALPN_DSCP, QosClass


def test_dscp_by_number_or_class_name():
    assert parse_dscp("46", "x") == 46
    assert parse_dscp("latency-critical", "x") == QosClass.LATENCY_CRITICAL.dscp
    assert parse_dscp(" Batch ", "x") == QosClass.BATCH.dscp
    for bad in ("64", "-1", "ef2", ""):
        with pytest.raises(PolicyError):
            parse_dscp(bad, "x")


def test_policy_from_specs():
    p = build_policy(ports=["8080=46", "9000=interactive"], cidrs=["10.0.0.0/8=batch", "fd00::/8=8"],
                     marks=["0x10=34", "7=standard"], alpn=True, sample_ports=["8080"])
    assert p.ports == {8080: 46, 9000: QosClass.INTERACTIVE.dscp}
    assert p.cidrs == {ipaddress.ip_network("10.0.0.0/8"): 8, ipaddress.ip_network("fd00::/8"): 8}
    assert p.marks == {16: 34, 7: QosClass.STANDARD.dscp}
    assert p.alpn and p.alpn_dscp == ALPN_DSCP
    assert p.sample and p.sample_ports == {8080}


def test_every_bad_spec_is_named_at_once():
    with pytest.raises(PolicyError) as e:
        build_policy(ports=["0=46", "8080", "8080=46", "8080=34", "x=1"], cidrs=["10.0.0.1/8=46"],
                     marks=["0=46", "abc=1"], sample_ports=["70000"])
    msg = str(e.value)
    for part in ("'0=46'", "'8080': expected PORT=DSCP", "'8080=34': 8080 already set to DSCP 46",
                 "'x=1'", "host bits set", "0 means unmarked", "'abc=1'", "70000"):
        assert part in msg, part


def test_cidr_keys_are_ipv4_mapped():
    k = layout.cidr_key(ipaddress.ip_network("10.1.0.0/16"))
    assert k.prefixlen == 96 + 16
    assert bytes(k.addr) == ipaddress.IPv6Address("::ffff:10.1.0.0").packed
    k6 = layout.cidr_key(ipaddress.ip_network("fd00:1::/32"))
    assert k6.prefixlen == 32 and bytes(k6.addr)[:4] == b"\xfd\x00\x00\x01"


def test_cli_arguments():
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    a = parser.parse_args(["bpf", "attach", "--interface", "eth0", "--dscp-port", "80=46",
                           "--dscp-port", "443=34", "--alpn", "--sample"])
    assert (a.interface, a.dscp_port, a.alpn, a.sample) == ("eth0", ["80=46", "443=34"], True, True)
    assert parser.parse_args(["bpf", "detach", "-i", "eth0"]).func is not None
    with pytest.raises(SystemExit):
        parser.parse_args(["bpf", "detach"])          # --interface is required


def test_cli_rejects_bad_specs_before_touching_the_system(capsys):
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bpf", "attach", "-i", "lo", "--dscp-port", "80=99"])
    assert args.func(args) == 2
    assert "DSCP 99 outside 0-63" in capsys.readouterr().err
