"""HTTP/2 header floods against a real plaintext collector, from a hand-written HTTP/2 client
(connection preface, SETTINGS, then HEADERS without END_HEADERS and CONTINUATION frames; HPACK
literals without indexing). The collector's RSS (VmRSS, VmHWM) is read from /proc during and after
the flood, on 1 and 3 connections, and a normal agent must still ingest afterwards.

Three floods:
- many small literal header fields from a peer that acknowledges the collector's SETTINGS: gRPC
  resets the call at the header list limit (16 KiB) and closes the connection; peak RSS stays
  within 1.5 x --grpc-memory-mib + 64 MiB.
- the same from a peer that never acknowledges them: gRPC 1.51 then applies its default limit,
  16 MiB a call (measured and printed, a known limitation in docs/security.md).
- one header field whose value never ends: gRPC 1.51 buffers a field whole before it checks the
  limit, so the peak grows with what the peer sends (measured and printed, a known limitation in
  docs/security.md); what is asserted is that the memory goes back to the system once the
  connections close (1 MiB mmap threshold) and that the collector keeps working."""

import shutil
import socket
import ssl
import struct
import tempfile
import threading
import time
import unittest

from harness import (Agent, Collector, assert_rss_at_most, metric_value, step_event,
                     wait_until)
from test_security import Pki

GRPC_MEMORY_MIB = 64
BOUND_MIB = 1.5 * GRPC_MEMORY_MIB + 64
FLOOD_BYTES = 64 << 20
UNACKED_FLOOD_BYTES = 20 << 20
FLOOD_SECONDS = 15


def frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) \
        + payload


def hpack_int(value, prefix_bits, first=0):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name, value):
    """A literal header field without indexing, with a literal name (RFC 7541, 6.2.2)."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


REQUEST_HEADERS = b"".join(literal(n, v) for n, v in (
    (b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/stepwatch.v1.Ingest/Report"),
    (b":authority", b"127.0.0.1"), (b"content-type", b"application/grpc"), (b"te", b"trailers")))


def read_server_settings(s):
    """Reads frames until the server's (non-ACK) SETTINGS frame; False if it never comes."""
    data = b""
    for _ in range(100):
        while len(data) >= 9:
            length = int.from_bytes(data[:3], "big")
            if len(data) < 9 + length:
                break
            kind, flags = data[3], data[4]
            data = data[9 + length:]
            if kind == 4 and not flags & 1:
                return True
        try:
            chunk = s.recv(65536)
        except OSError:  # ssl.SSLError too: the collector's TLS alert
            return False
        if not chunk:
            return False
        data += chunk
    return False


def flood(port, kind, result, tls=None):
    """One connection: HEADERS without END_HEADERS, then CONTINUATION frames until FLOOD_BYTES
    are sent, FLOOD_SECONDS pass, or the collector closes or stops reading. Leaves the socket
    open in result["socket"]. `tls`: an ssl.SSLContext to speak TLS with."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    result["socket"] = s
    result["sent"], result["outcome"] = 0, "handshake failed"
    if tls is not None:
        try:
            s = tls.wrap_socket(s, server_hostname="127.0.0.1")
        except (ssl.SSLError, OSError):
            return
        result["socket"] = s
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b""))
    if kind != "small-unacked":
        # gRPC enforces the header list limit it advertises only once the peer acknowledges its
        # SETTINGS: wait for them, then ACK.
        if not read_server_settings(s):
            result["outcome"] = "no SETTINGS from the collector"
            return
        s.sendall(frame(4, 1, 0, b""))
    first = REQUEST_HEADERS
    if kind.startswith("small"):
        payload = b""
        i = 0
        while len(payload) < 16000:
            payload += literal(b"x-f%05d" % i, b"v" * 8)
            i += 1
    else:
        # One field whose value is FLOOD_BYTES long: it never completes.
        first += b"\x00" + hpack_int(3, 7) + b"x-b" + hpack_int(FLOOD_BYTES, 7)
        payload = b"v" * 16000
    s.sendall(frame(1, 0, 1, first))
    continuation = frame(9, 0, 1, payload)
    # A peer that never ACKs gets 16 MiB a call: a little beyond it shows the cost, sparing the
    # machine what 64 MiB on 3 connections took (up to 1.4 GiB).
    limit = UNACKED_FLOOD_BYTES if kind == "small-unacked" else FLOOD_BYTES
    sent, outcome = 0, "sent all"
    deadline = time.monotonic() + FLOOD_SECONDS
    try:
        while sent < limit:
            if time.monotonic() > deadline:
                outcome = "time limit"
                break
            s.sendall(continuation * 8)
            sent += len(payload) * 8
    except socket.timeout:
        outcome = "collector stopped reading"
    except OSError:  # ssl.SSLError too: a TLS alert from the collector
        outcome = "collector closed the connection"
    result["sent"] = sent
    result["outcome"] = outcome


def memory_mib(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) / 1024.0
    return out


class HeaderFloodTest(unittest.TestCase):
    def run_flood(self, kind, connections):
        with tempfile.TemporaryDirectory(prefix="stepwatch-header-flood-") as tmp:
            with Collector(tmp, grpc_memory_mib=GRPC_MEMORY_MIB) as c:
                pid = c.process.proc.pid
                before = memory_mib(pid)
                results = [{} for _ in range(connections)]
                threads = [threading.Thread(target=flood, args=(c.grpc_port, kind, r))
                           for r in results]
                peak_during = 0.0
                for t in threads:
                    t.start()
                while any(t.is_alive() for t in threads):
                    peak_during = max(peak_during, memory_mib(pid)["VmRSS"])
                    time.sleep(0.05)
                for t in threads:
                    t.join(timeout=60)
                during = memory_mib(pid)
                for r in results:
                    if "socket" in r:
                        r["socket"].close()
                # Memory back once the connections are gone and the collector's periodic
                # malloc_trim (every 10 s) ran (bounded wait).
                after = memory_mib(pid)
                for _ in range(80):
                    time.sleep(0.2)
                    after = memory_mib(pid)
                    if after["VmRSS"] <= before["VmRSS"] + 32:
                        break
                print(f"\n{kind} flood, {connections} connection(s): sent "
                      f"{[round(r.get('sent', 0) / 2**20, 1) for r in results]} MiB "
                      f"({sorted({r.get('outcome') for r in results})}); RSS before "
                      f"{before['VmRSS']:.0f} MiB, peak {max(peak_during, during['VmRSS']):.0f}, "
                      f"VmHWM {during['VmHWM']:.0f}, after {after['VmRSS']:.0f} MiB")
                self.assertTrue(c.process.alive())
                # A normal agent still ingests. After an endless field the collector first works
                # through what the flooders left in its socket buffers (gRPC re-copies the field
                # for every frame): on a busy 2-core machine that took up to 47 s, during which
                # the agent keeps its steps and retries.
                started = time.monotonic()
                with Agent(tmp, c.grpc_addr, node="node-ok") as agent:
                    for step in range(3):
                        agent.send(step_event("after-flood", 0, 1, step, 0.1))
                    wait_until(lambda: metric_value(
                        c.scrape(), "stepwatch_collector_steps_received_total") == 3,
                        timeout=120, message="steps of a normal agent after the flood")
                print(f"a normal agent's steps arrived {time.monotonic() - started:.1f} s after "
                      "the flood ended")
                return results, during, after

    def test_small_headers_flood_is_cut_at_the_header_list_limit(self):
        for connections in (1, 3):
            results, during, after = self.run_flood("small", connections)
            for r in results:
                self.assertEqual(r["outcome"], "collector closed the connection")
                self.assertLess(r["sent"], 16 << 20)
            assert_rss_at_most(self, during["VmHWM"], BOUND_MIB)
            assert_rss_at_most(self, after["VmRSS"], BOUND_MIB)

    def test_small_headers_flood_without_settings_ack(self):
        # A peer that never acknowledges the collector's SETTINGS gets gRPC 1.51's default header
        # list limit, 16 MiB a call, not the 16 KiB advertised: measured, not bounded (a known
        # limitation, docs/security.md). What holds: the collector survives, gives the memory
        # back once the connections close, and a normal agent ingests.
        for connections in (1, 3):
            results, during, after = self.run_flood("small-unacked", connections)
            assert_rss_at_most(self, after["VmRSS"], BOUND_MIB)

    def test_one_endless_header_field_memory_goes_back(self):
        for connections in (1, 3):
            _, _, after = self.run_flood("endless", connections)
            assert_rss_at_most(self, after["VmRSS"], BOUND_MIB)


class HeaderFloodMutualTlsTest(unittest.TestCase):
    """With --tls-client-ca a peer without a certificate of the CA never reaches gRPC's HTTP/2
    parser: the endless-field flood is cut at the handshake."""

    @unittest.skipIf(shutil.which("openssl") is None, "openssl is not installed")
    def test_flood_without_a_client_certificate_is_cut_at_the_handshake(self):
        with tempfile.TemporaryDirectory(prefix="stepwatch-header-flood-tls-") as tmp:
            pki = Pki(tmp)
            cert, key = pki.issue("server", "stepwatch-collector", "IP:127.0.0.1")
            with Collector(tmp, grpc_memory_mib=GRPC_MEMORY_MIB, tls_cert=cert, tls_key=key,
                           tls_client_ca=pki.ca) as c:
                context = ssl.create_default_context(cafile=pki.ca)
                context.set_alpn_protocols(["h2"])
                results = [{} for _ in range(3)]
                threads = [threading.Thread(target=flood, args=(c.grpc_port, "endless", r),
                                            kwargs={"tls": context}) for r in results]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(timeout=60)
                for r in results:
                    if "socket" in r:
                        r["socket"].close()
                memory = memory_mib(c.process.proc.pid)
                print(f"\nmutual TLS, no client certificate, 3 connections: sent "
                      f"{[round(r.get('sent', 0) / 2**20, 2) for r in results]} MiB "
                      f"({sorted({r.get('outcome') for r in results})}); VmHWM "
                      f"{memory['VmHWM']:.0f} MiB")
                for r in results:
                    self.assertIn(r["outcome"], ("handshake failed",
                                                 "no SETTINGS from the collector",
                                                 "collector closed the connection"))
                    self.assertLess(r["sent"], 1 << 20)
                assert_rss_at_most(self, memory["VmHWM"], BOUND_MIB)
                self.assertTrue(c.process.alive())


if __name__ == "__main__":
    unittest.main()
