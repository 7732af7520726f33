#!/usr/bin/env python3
"""Socket agent for the natrix end-to-end tests.

Runs inside one network namespace (``ip netns exec NS python3 e2e_agent.py``)
and executes commands read from stdin, one JSON object per line:

    {"id": 7, "op": "udp_open", "bind_port": 40000}

and answers on stdout, one JSON object per line:

    {"id": 7, "ok": true, "result": {...}}
    {"id": 7, "ok": false, "errno": "ECONNREFUSED", "error": "..."}

It holds sockets between commands (so a test can send from one socket, do
something in another namespace, then receive on the first socket) and runs
small servers in threads: a UDP echo that reports the peer address it saw,
a TCP server that reports the peer address of each connection, an HTTP
server that records its clients, and a packet sniffer (AF_PACKET).

Only the Python standard library is used: natrix's own code is never
involved in checking what arrived.
"""

import errno as errno_mod
import http.server
import json
import os
import socket
import struct
import sys
import threading
import time

_lock = threading.Lock()
_socks = {}
_servers = {}
_next = [1]


def _new_id(prefix):
    with _lock:
        n = _next[0]
        _next[0] += 1
    return f"{prefix}{n}"


def _enc(data):
    return data.decode("latin-1")


def _dec(text):
    return text.encode("latin-1")


class _Server:
    def __init__(self, kind):
        self.kind = kind
        self.events = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.closers = []

    def record(self, **event):
        event["t"] = time.time()
        with self.lock:
            self.events.append(event)

    def serve_datagrams(self, s, handle):
        """Calls handle(data, addr) for each datagram on socket `s` (with a
        timeout set) until the server is closed, in a daemon thread."""
        def loop():
            while not self.stop.is_set():
                try:
                    data, addr = s.recvfrom(65535)
                except socket.timeout:
                    continue
                except OSError:
                    if self.stop.is_set():
                        return
                    continue
                handle(data, addr)

        threading.Thread(target=loop, daemon=True).start()

    def close(self):
        self.stop.set()
        for c in self.closers:
            try:
                c()
            except Exception:
                pass


# --- servers -----------------------------------------------------------------

def _udp_echo(port, bind="0.0.0.0"):
    """Echo server: answers each datagram with JSON {"peer": [ip, port],
    "data": payload} from the port it was received on."""
    srv = _Server("udp_echo")
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((bind, port))
    s.settimeout(0.2)
    srv.closers.append(s.close)

    def echo(data, peer):
        srv.record(peer=list(peer), data=_enc(data))
        reply = json.dumps({"peer": list(peer), "data": _enc(data)}).encode()
        try:
            s.sendto(reply, peer)
        except OSError:
            pass

    srv.serve_datagrams(s, echo)
    return srv


def _tcp_report(port, bind="0.0.0.0"):
    """TCP server: on each connection, sends one JSON line {"peer": [ip, port]}
    then echoes whatever it receives until the client closes."""
    srv = _Server("tcp_report")
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((bind, port))
    ls.listen(64)
    ls.settimeout(0.2)
    srv.closers.append(ls.close)

    def serve(conn, peer):
        srv.closers.append(conn.close)
        try:
            conn.settimeout(0.5)
            conn.sendall((json.dumps({"peer": list(peer)}) + "\n").encode())
            while not srv.stop.is_set():
                try:
                    data = conn.recv(65535)
                except socket.timeout:
                    continue
                if not data:
                    break
                conn.sendall(data)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def loop():
        while not srv.stop.is_set():
            try:
                conn, peer = ls.accept()
            except socket.timeout:
                continue
            except OSError:
                if srv.stop.is_set():
                    return
                continue
            srv.record(peer=list(peer))
            threading.Thread(target=serve, args=(conn, peer), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return srv


def _http(port, body, bind="0.0.0.0"):
    """HTTP server answering every GET with `body`, recording client addresses."""
    srv = _Server("http")
    payload = _dec(body)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            srv.record(peer=list(self.client_address), path=self.path)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    class Server(http.server.ThreadingHTTPServer):
        allow_reuse_address = True
        daemon_threads = True

    httpd = Server((bind, port), Handler)
    srv.closers.append(httpd.shutdown)
    srv.closers.append(httpd.server_close)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                     daemon=True).start()
    return srv


ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4


def _sniff(ifname="eth0"):
    """Records every IPv4 frame received (not sent) on `ifname`: addresses,
    protocol, ports, TCP flags, ICMP type/code."""
    srv = _Server("sniff")
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((ifname, 0))
    s.settimeout(0.2)
    srv.closers.append(s.close)

    def observe(frame, addr):
        if addr[2] == PACKET_OUTGOING or len(frame) < 34:
            return
        if struct.unpack("!H", frame[12:14])[0] != 0x0800:
            return
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        proto = ip[9]
        ev = {"src": socket.inet_ntoa(ip[12:16]), "dst": socket.inet_ntoa(ip[16:20]),
              "proto": proto}
        l4 = ip[ihl:]
        if proto in (6, 17) and len(l4) >= 4:
            ev["sport"], ev["dport"] = struct.unpack("!HH", l4[:4])
            if proto == 6 and len(l4) >= 14:
                ev["flags"] = l4[13]
        elif proto == 1 and len(l4) >= 2:
            ev["type"], ev["code"] = l4[0], l4[1]
        srv.record(**ev)

    srv.serve_datagrams(s, observe)
    return srv


# --- commands ----------------------------------------------------------------

def _sock(sid):
    try:
        return _socks[sid]
    except KeyError:
        raise ValueError(f"unknown socket {sid}")


IP_RECVERR = getattr(socket, "IP_RECVERR", 11)


def op_udp_open(bind_port=0, bind_addr="0.0.0.0", connect=None, recverr=False):
    """recverr: set IP_RECVERR, without which Linux does not report ICMP
    errors it considers soft (net/host unreachable, code 0/1) on UDP sockets."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if recverr:
        s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
    s.bind((bind_addr, bind_port))
    if connect:
        s.connect(tuple(connect))
    sid = _new_id("u")
    _socks[sid] = s
    return {"sid": sid, "local": list(s.getsockname())}


def op_udp_send(sid, data, to=None):
    s = _sock(sid)
    if to:
        s.sendto(_dec(data), tuple(to))
    else:
        s.send(_dec(data))
    return {}


def op_udp_recv(sid, timeout=2.0):
    s = _sock(sid)
    s.settimeout(timeout)
    data, peer = s.recvfrom(65535)
    return {"data": _enc(data), "from": list(peer)}


def op_tcp_connect(to, bind_port=0, reuse=False, timeout=3.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if reuse:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if bind_port:
        s.bind(("0.0.0.0", bind_port))
    s.settimeout(timeout)
    t0 = time.monotonic()
    try:
        s.connect(tuple(to))
    except BaseException as e:
        s.close()
        e.elapsed = time.monotonic() - t0
        raise
    sid = _new_id("t")
    _socks[sid] = s
    return {"sid": sid, "local": list(s.getsockname()), "peer": list(s.getpeername()),
            "elapsed": time.monotonic() - t0}


def op_tcp_listen(port, reuse=False):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("0.0.0.0", port))
    s.listen(16)
    sid = _new_id("l")
    _socks[sid] = s
    return {"sid": sid, "local": list(s.getsockname())}


def op_tcp_accept(sid, timeout=2.0):
    s = _sock(sid)
    s.settimeout(timeout)
    conn, peer = s.accept()
    cid = _new_id("t")
    _socks[cid] = conn
    return {"sid": cid, "peer": list(peer), "local": list(conn.getsockname())}


def op_tcp_send(sid, data):
    _sock(sid).sendall(_dec(data))
    return {}


def op_tcp_recv_line(sid, timeout=2.0):
    """Reads up to and including the first newline (or EOF)."""
    s = _sock(sid)
    s.settimeout(timeout)
    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = s.recv(4096)
        if not chunk:
            break
        buf += chunk
    return {"data": _enc(buf)}


def op_tcp_recv(sid, timeout=2.0, size=65535):
    s = _sock(sid)
    s.settimeout(timeout)
    return {"data": _enc(s.recv(size))}


def _inet_checksum(data):
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def op_icmp_ping(dst, count=3, ident=None, interval=0.2, timeout=2.0, size=48, tag="e2e"):
    """ICMP echo over a raw socket (no dependency on ping(8)). Returns the
    sequence numbers answered by `dst` with our identifier and our payload
    (which carries `tag`, so replies meant for another host do not count)."""
    ident = (os.getpid() & 0xFFFF) if ident is None else ident
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    answered, sent = [], []
    try:
        for seq in range(1, count + 1):
            payload = (b"natrix-%s-%05d-" % (tag.encode(), seq)).ljust(size, b"x")
            hdr = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
            csum = _inet_checksum(hdr + payload)
            s.sendto(struct.pack("!BBHHH", 8, 0, csum, ident, seq) + payload, (dst, 0))
            sent.append(seq)
            deadline = time.monotonic() + (interval if seq < count else timeout)
            while time.monotonic() < deadline:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    pkt, addr = s.recvfrom(65535)
                except socket.timeout:
                    break
                ihl = (pkt[0] & 0x0F) * 4
                icmp = pkt[ihl:]
                if addr[0] != dst or len(icmp) < 8 or icmp[0] != 0:
                    continue
                _t, _c, _k, rid, rseq = struct.unpack("!BBHHH", icmp[:8])
                if rid != ident or _inet_checksum(icmp) != 0:
                    continue
                expect = (b"natrix-%s-%05d-" % (tag.encode(), rseq)).ljust(size, b"x")
                if icmp[8:] == expect and rseq not in answered:
                    answered.append(rseq)
                if seq == count and len(answered) == count:
                    break
            if len(answered) == count:
                break
    finally:
        s.close()
    return {"sent": sent, "answered": sorted(answered), "ident": ident}


def op_close(sid):
    s = _socks.pop(sid, None)
    if s is not None:
        s.close()
    return {}


def op_udp_echo_server(port, bind="0.0.0.0"):
    sid = _new_id("s")
    _servers[sid] = _udp_echo(port, bind)
    return {"server": sid}


def op_tcp_report_server(port, bind="0.0.0.0"):
    sid = _new_id("s")
    _servers[sid] = _tcp_report(port, bind)
    return {"server": sid}


def op_http_server(port, body, bind="0.0.0.0"):
    sid = _new_id("s")
    _servers[sid] = _http(port, body, bind)
    return {"server": sid}


def op_sniff_start(ifname="eth0"):
    sid = _new_id("s")
    _servers[sid] = _sniff(ifname)
    return {"server": sid}


def op_server_events(server):
    srv = _servers[server]
    with srv.lock:
        return {"events": list(srv.events)}


def op_server_stop(server):
    srv = _servers.pop(server, None)
    if srv:
        srv.close()
    return {}


def op_ping():
    return {"pid": os.getpid()}


OPS = {name[3:]: fn for name, fn in globals().items() if name.startswith("op_")}


def _errno_name(e):
    if isinstance(e, socket.timeout):
        return "TIMEOUT"
    if isinstance(e, OSError) and e.errno is not None:
        return errno_mod.errorcode.get(e.errno, str(e.errno))
    return type(e).__name__


def main():
    out = sys.stdout
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        rid = req.pop("id")
        op = req.pop("op")
        try:
            result = OPS[op](**req)
            resp = {"id": rid, "ok": True, "result": result}
        except Exception as e:  # reported to the test, never fatal here
            resp = {"id": rid, "ok": False, "errno": _errno_name(e), "error": repr(e)}
            if hasattr(e, "elapsed"):
                resp["elapsed"] = e.elapsed
        out.write(json.dumps(resp) + "\n")
        out.flush()
    for srv in list(_servers.values()):
        srv.close()
    for s in list(_socks.values()):
        try:
            s.close()
        except OSError:
            pass


if __name__ == "__main__":
    main()
