#!/usr/bin/env python3
"""Writes a seed corpus for the sctp_nat fuzz target (fuzz/fuzz_targets/sctp_nat.rs).

Each seed is a limits byte, then records [flags][len_hi][len_lo][SCTP packet]
(flags bit 0 = from outside, bits 1-2 = which subscriber or server, bits 3-7 =
seconds to advance): an association's life from INIT to SHUTDOWN-COMPLETE,
an ABORT with the T bit, a colliding INIT, an ASCONF with the VTags parameter
and Add IP, chunk and parameter floods, zero and overlong lengths. SCTP
packets are built by scapy so the seeds start from well-formed traffic.

usage: tools/sctp_fuzz_seeds.py fuzz/corpus/sctp_nat
"""

import struct
import sys
from pathlib import Path

from scapy.layers.sctp import (SCTP, SCTPChunkAbort, SCTPChunkCookieAck, SCTPChunkCookieEcho, SCTPChunkData,
                               SCTPChunkHeartbeatReq, SCTPChunkInit, SCTPChunkInitAck, SCTPChunkParamIPv4Addr,
                               SCTPChunkParamStateCookie, SCTPChunkShutdown, SCTPChunkShutdownAck,
                               SCTPChunkShutdownComplete)

IN, OUT = 0, 1
LIMITS = 0b0_01_110_01  # max_chunks 2, max_params 6, tracking 1, reply_ootb inside


def rec(packet, side=IN, who=0, advance=0):
    b = bytes(packet)
    return struct.pack("!BH", side | (who << 1) | (advance << 3), len(b)) + b


def out(tag, *chunks):
    p = SCTP(sport=5000, dport=38412, tag=tag)
    for c in chunks:
        p = p / c
    return p


def inn(tag, *chunks):
    p = SCTP(sport=38412, dport=5000, tag=tag)
    for c in chunks:
        p = p / c
    return p


def init(tag):
    return SCTPChunkInit(init_tag=tag, a_rwnd=65536, n_out_streams=1, n_in_streams=1, init_tsn=1)


def init_ack(tag, *params):
    return SCTPChunkInitAck(init_tag=tag, a_rwnd=65536, n_out_streams=1, n_in_streams=1, init_tsn=9,
                            params=[SCTPChunkParamStateCookie(cookie=b"c" * 8), *params])


def asconf(params: bytes):
    body = struct.pack("!I", 1) + bytes(SCTPChunkParamIPv4Addr(addr="0.0.0.0")) + params
    return struct.pack("!BBH", 0xC1, 0, 4 + len(body)) + body


def handshake(a=0x11, b=0x22):
    return [rec(out(0, init(a))), rec(inn(a, init_ack(b, SCTPChunkParamIPv4Addr(addr="198.51.100.21"))), OUT),
            rec(out(b, SCTPChunkCookieEcho(cookie=b"c" * 8))), rec(inn(a, SCTPChunkCookieAck()), OUT)]


def seeds():
    data = SCTPChunkData(tsn=1, stream_id=0, stream_seq=0, proto_id=0, beginning=1, ending=1, data=b"x")
    yield handshake() + [rec(out(0x22, data)), rec(inn(0x11, data), OUT),
                         rec(out(0x22, SCTPChunkShutdown(cumul_tsn_ack=1))), rec(inn(0x11, SCTPChunkShutdownAck()), OUT),
                         rec(out(0x22, SCTPChunkShutdownComplete())), rec(inn(0x11, data), OUT, advance=1)]
    yield handshake() + [rec(inn(0x22, SCTPChunkAbort(TCB=1)), OUT), rec(out(0x22, data))]
    yield [rec(out(0, init(0x5EED))), rec(out(0, init(0x5EED)), who=1)]
    vtags = struct.pack("!HHIII", 0xC008, 16, 1, 0x11, 0x22)
    add_ip = struct.pack("!HHI", 0xC001, 16, 2) + bytes(SCTPChunkParamIPv4Addr(addr="0.0.0.0"))
    yield [rec(struct.pack("!HHII", 5000, 38412, 0x22, 0) + asconf(vtags + add_ip)),
           rec(struct.pack("!HHII", 38412, 5000, 0x11, 0) + asconf(add_ip), OUT, who=2)]
    yield handshake() + [rec(inn(0x11, *[SCTPChunkHeartbeatReq() for _ in range(200)], SCTPChunkAbort()), OUT)]
    flood = b"".join(bytes(SCTPChunkParamIPv4Addr(addr="192.0.2.%d" % i)) for i in range(60))
    yield [rec(struct.pack("!HHII", 5000, 38412, 0x22, 0) + asconf(flood + vtags))]
    for length in (0, 3, 999):
        bad = bytes(out(0x22, SCTPChunkHeartbeatReq()))
        yield handshake() + [rec(bad[:14] + struct.pack("!H", length) + bad[16:])]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = Path(sys.argv[1])
    d.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(seeds()):
        (d / f"seed-{i:02}").write_bytes(bytes([LIMITS]) + b"".join(s))


if __name__ == "__main__":
    main()
