"""What one renewal of an etcd lease costs, for benches/etcd-renewal.sh.

measure: on a running server that holds its lease from a one-member etcd, watches the loopback
interface for --seconds and prints one JSON line: every TCP packet to or from etcd's client port,
as the kernel hands them to a packet socket (each packet once, as it leaves; the count of packets
the kernel dropped for want of room is checked to be 0), and etcd's own count of the gRPC calls
that its JSON gateway made, by method (each HTTP call is one). etcd's gateway talks to etcd over
connections of its own to the same port: those, found with `ss` as connections whose both ends
belong to etcd, are left out, so that only the lease worker's traffic counts.

The worker's packets come in bursts, one per renewal, a second apart with snowid.lease_ttl = 3;
a burst ends where no packet came for 300 ms. A renewal's time is from its first packet (the SYN
of a new connection, or the first request on a kept one) to the last that carries data (the last
answer: acknowledgements and the closing of connections, which the worker does not wait for, come
after); the connections it used are the worker's ports its packets show, those it opened its SYNs;
its bytes those of its IP packets, both ways. Bursts cut by the window's edges are left out.

report: one table of every build and transport measured.
"""

import argparse
import ctypes
import json
import re
import socket
import statistics
import struct
import subprocess
import sys
import time
import urllib.request

GAP = 0.3  # seconds between two renewals' bursts, at least
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
SOL_PACKET = 263
PACKET_STATISTICS = 6
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33


def etcd_calls(metrics_port):
    """etcd's count of gRPC calls started, by method."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    calls = {}
    for line in text.splitlines():
        found = re.match(r'grpc_server_started_total\{.*grpc_method="(\w+)".*\} (\S+)$', line)
        if found:
            calls[found[1]] = calls.get(found[1], 0) + float(found[2])
    return calls


def etcd_own_ports(port, etcd_pid):
    """The local ports of etcd's own connections to its client port (its gateway's)."""
    out = subprocess.run(["ss", "-Htnp", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    ports = set()
    for line in out.splitlines():
        if f"pid={etcd_pid}," in line:
            ports.add(int(line.split()[2].rsplit(":", 1)[1]))
    return ports


def only_port(port):
    """A classic BPF program that keeps the IPv4 TCP packets to or from `port`, so that the
    kernel hands over nothing else."""
    drop, keep = 11, 12
    program = [
        (0x28, 0, 0, 12),  # the ethertype
        (0x15, 0, drop - 2, 0x0800),  # IPv4
        (0x30, 0, 0, 23),  # the protocol
        (0x15, 0, drop - 4, 6),  # TCP
        (0x28, 0, 0, 20),  # the fragment offset
        (0x45, drop - 6, 0, 0x1FFF),  # a first fragment or none
        (0xB1, 0, 0, 14),  # X: the IP header's length
        (0x48, 0, 0, 14),  # the source port
        (0x15, keep - 9, 0, port),
        (0x48, 0, 0, 16),  # the destination port
        (0x15, keep - 11, 0, port),
        (0x06, 0, 0, 0),  # drop
        (0x06, 0, 0, 0x40000),  # keep
    ]
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in program))
    return code, struct.pack("HL", len(program), ctypes.addressof(code))


def capture(port, seconds):
    """(time, source port, destination port, IP length, SYN without ACK, TCP payload length) of
    every TCP packet of `port` on loopback for `seconds`."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
    code, program = only_port(port)
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, program)
    sock.bind(("lo", 0))
    sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)  # resets the counts
    sock.settimeout(0.1)
    packets = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            frame, address = sock.recvfrom(65536)
        except socket.timeout:
            continue
        now = time.monotonic()
        if address[2] != PACKET_OUTGOING or frame[12:14] != b"\x08\x00" or frame[23] != 6:
            continue
        ip = frame[14:]
        header = (ip[0] & 0x0F) * 4
        length = struct.unpack("!H", ip[2:4])[0]
        source, destination = struct.unpack("!HH", ip[header:header + 4])
        if port not in (source, destination):
            continue
        flags = ip[header + 13]
        payload = length - header - (ip[header + 12] >> 4) * 4
        packets.append((now, source, destination, length, flags & 0x12 == 0x02, payload))
    _, dropped = struct.unpack("II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
    return packets, dropped


def measure(args):
    own = etcd_own_ports(args.port, args.etcd_pid)
    before = etcd_calls(args.metrics_port)
    started = time.monotonic()
    packets, dropped = capture(args.port, args.seconds)
    ended = time.monotonic()
    after = etcd_calls(args.metrics_port)
    own |= etcd_own_ports(args.port, args.etcd_pid)
    if dropped:
        sys.exit(f"etcd_renewal.py: the kernel dropped {dropped} packets of the capture")
    worker = [packet for packet in packets
              if (packet[1] if packet[2] == args.port else packet[2]) not in own]
    bursts = []
    for packet in worker:
        if bursts and packet[0] - bursts[-1][-1][0] < GAP:
            bursts[-1].append(packet)
        else:
            bursts.append([packet])
    whole = [burst for burst in bursts
             if burst[0][0] - started >= GAP and ended - burst[-1][0] >= GAP]
    calls = {method: after.get(method, 0) - before.get(method, 0) for method in after}
    print(json.dumps({
        "build": args.build,
        "transport": args.transport,
        "seconds": args.seconds,
        "renewals": len(whole),
        "keepalives": calls.get("LeaseKeepAlive", 0),
        "calls": sum(calls.values()),
        "calls_by_method": {method: count for method, count in calls.items() if count},
        "connections": [sum(packet[4] for packet in burst) for burst in whole],
        "connections_used": [len({packet[1] if packet[2] == args.port else packet[2] for packet in burst})
                             for burst in whole],
        "bytes": [sum(packet[3] for packet in burst) for burst in whole],
        "packets": [len(burst) for burst in whole],
        "ms": [(max(packet[0] for packet in burst if packet[5]) - burst[0][0]) * 1000
               for burst in whole],
        "all_connections": sum(packet[4] for packet in worker),
    }))


def report(args):
    every = [json.loads(line) for line in open(args.samples) if line.strip()]
    samples = [sample for sample in every if "kind" not in sample]
    lookups = [sample for sample in every if sample.get("kind") == "lookup"]
    lines = [
        "# One renewal of an etcd lease",
        "",
        f"benches/etcd-renewal.sh: one etcd member (Debian's etcd {args.etcd_version}) and one server "
        "on loopback, `snowid.lease_ttl = 3` (a renewal a second), each build and transport watched "
        f"for {samples[0]['seconds']} s once the lease was held. Calls: etcd's count of its "
        "gateway's calls, over the keep-alives (one per renewal). Connections, bytes (IP packets, "
        "both ways) and time: per renewal, from the packets on loopback; the time runs from the "
        "renewal's first packet to its last answer. libcurl " + args.libcurl + ".",
        "",
        "| build | transport | renewals | calls per renewal | connections used per renewal | connections opened per renewal | bytes per renewal | packets per renewal | renewal time, median | renewal time, 90th percentile |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for sample in samples:
        ms = sorted(sample["ms"])
        p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
        per = sample["keepalives"] or 1
        lines.append(
            f"| {sample['build']} | {sample['transport']} | {sample['renewals']} "
            f"| {sample['calls'] / per:.2f} "
            f"| {statistics.mean(sample['connections_used']):.2f} "
            f"| {statistics.mean(sample['connections']):.2f} "
            f"| {statistics.mean(sample['bytes']):,.0f} "
            f"| {statistics.mean(sample['packets']):.1f} "
            f"| {statistics.median(ms):.2f} ms | {p90:.2f} ms |")
    methods = sorted({method for sample in samples for method in sample["calls_by_method"]})
    lines += ["", "The calls of each run, by etcd's gRPC method: "
              + "; ".join(f"{sample['build']}, {sample['transport']}: "
                          + ", ".join(f"{method} {sample['calls_by_method'].get(method, 0):.0f}"
                                      for method in methods)
                          for sample in samples) + "."]
    if lookups:
        lines += [
            "",
            "## A member whose name never resolves",
            "",
            "`snowid.registry` names two members, the first by a host name whose DNS server takes "
            "every query and answers none (`options timeout:8 attempts:1`), the second by address: "
            "the time from the server's start (`pg_ctl start`) until its lease is held, and how "
            "long a fast shutdown 0.5 s after the start takes.",
            "",
            "| build | lease held after | fast shutdown took |",
            "|---|---:|---:|",
        ]
        lines += [f"| {sample['build']} | {sample['held_s']:.2f} s | {sample['stop_s']:.2f} s |"
                  for sample in lookups]
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as out:
        out.write(text)
    print(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("measure")
    one.add_argument("--build", required=True)
    one.add_argument("--transport", required=True)
    one.add_argument("--port", type=int, required=True)
    one.add_argument("--metrics-port", type=int, required=True)
    one.add_argument("--etcd-pid", type=int, required=True)
    one.add_argument("--seconds", type=float, required=True)
    all_ = commands.add_parser("report")
    all_.add_argument("--out", required=True)
    all_.add_argument("--etcd-version", required=True)
    all_.add_argument("--libcurl", required=True)
    all_.add_argument("samples")
    args = parser.parse_args()
    {"measure": measure, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
