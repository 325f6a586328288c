"""Packet probes for the lab (tests, benchmark): real packets sent from inside slot namespaces.

Everything runs through ``ip netns exec`` and blocks. A probe that expects
success retries within a deadline (the first packet after VXLAN learning may
be lost); one that expects failure makes a bounded number of attempts.

A test and benchmark helper (I/O: processes in namespaces): no service code imports it.
"""
from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time

# A TCP echo server: prints "ready" once listening, answers each connection with its port number.
TCP_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(16); print("ready", flush=True)
while True:
    c, _ = s.accept(); c.sendall(sys.argv[2].encode()); c.close()
"""
TCP_CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
assert c.recv(16) == sys.argv[2].encode()
"""
# A UDP sink: prints "ready", then one line per datagram received (its payload).
UDP_SINK = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], int(sys.argv[2]))); print("ready", flush=True)
while True:
    print(s.recv(256).decode(), flush=True)
"""
UDP_SEND = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 0))
s.sendto(sys.argv[4].encode(), (sys.argv[2], int(sys.argv[3])))
"""


def run(ns: str | None, *argv: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    full = (["ip", "netns", "exec", ns] if ns else []) + list(argv)
    proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} failed: {proc.stderr.strip()}")
    return proc


def ping_once(ns: str, ip: str) -> bool:
    return run(ns, "ping", "-c1", "-W1", "-n", ip, check=False).returncode == 0


def reaches(ns: str, ip: str, deadline_s: float = 15.0) -> bool:
    """True as soon as one ping gets an answer; False when none did within the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if ping_once(ns, ip):
            return True
    return False


def never_reaches(ns: str, ip: str, attempts: int = 2) -> bool:
    return not any(ping_once(ns, ip) for _ in range(attempts))


def python(ns: str, code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def start(ns: str, code: str, *args: str) -> subprocess.Popen:
    """Start a server script in ``ns`` and wait for its "ready" line (raises if it exits instead)."""
    proc = python(ns, code, *args)
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"server {args} in {ns} did not start")
    return proc


def tcp_connects(ns: str, ip: str, port: int, timeout_s: float = 1.5) -> bool:
    proc = run(ns, sys.executable, "-c", TCP_CLIENT, ip, str(port), str(timeout_s), check=False)
    return proc.returncode == 0


def tcp_eventually(ns: str, ip: str, port: int, deadline_s: float = 15.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if tcp_connects(ns, ip, port):
            return True
    return False


def udp_send(ns: str, src_ip: str, dst_ip: str, port: int, payload: str) -> None:
    run(ns, sys.executable, "-c", UDP_SEND, src_ip, dst_ip, str(port), payload)

# Sends one raw ARP request "who-has <target> tell <sender ip>" from <mac> on <ifname> (forgeable at will).
ARP_REQUEST = """
import socket, sys
ifname, mac, sender, target = sys.argv[1:5]
m = bytes.fromhex(mac.replace(":", "")); ip = lambda a: socket.inet_aton(a)
frame = b"\\xff" * 6 + m + b"\\x08\\x06" + bytes.fromhex("0001080006040001") + m + ip(sender) + b"\\x00" * 6 + ip(target)
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind((ifname, 0)); s.send(frame)
"""


def arp_request(ns: str, ifname: str, mac: str, sender_ip: str, target_ip: str) -> None:
    run(ns, sys.executable, "-c", ARP_REQUEST, ifname, mac, sender_ip, target_ip)


def neighbour(ns: str, ip: str) -> str:
    return run(ns, "ip", "neigh", "show", ip).stdout.strip()


def read_lines(proc: subprocess.Popen, count: int, deadline_s: float = 15.0) -> list[str]:
    """Up to ``count`` lines a probe server printed, waiting at most ``deadline_s`` in all (never hangs).

    A reader thread does the blocking readline (select() cannot see lines already in the pipe's buffer);
    it ends when the server is killed."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(proc.stdout.readline()) for _ in range(count)], daemon=True).start()
    got: list[str] = []
    end = time.monotonic() + deadline_s
    while len(got) < count:
        try:
            line = lines.get(timeout=max(0.01, end - time.monotonic()))
        except queue.Empty:
            break
        if not line:
            break
        got.append(line.strip())
    return got
