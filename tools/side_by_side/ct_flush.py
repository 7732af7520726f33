#!/usr/bin/env python3
"""Empties the conntrack table of the network namespace it runs in, as
`conntrack -F` would (conntrack-tools is often not installed): one
ctnetlink delete request without attributes. scripts/side-by-side.sh runs
it in nx-nat before each new-flow trial, so the kernel starts every trial
with no state, as natrix does after its restart.

Usage: ip netns exec nx-nat python3 ct_flush.py
"""

import os
import socket
import struct

NETLINK_NETFILTER = 12
NFNL_SUBSYS_CTNETLINK = 1
IPCTNL_MSG_CT_DELETE = 2
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2


def main():
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER) as s:
        s.bind((0, 0))
        # nlmsghdr (length, type, flags, seq, port id), then nfgenmsg (family, version, res_id).
        body = struct.pack("=BBH", socket.AF_INET, 0, 0)
        head = struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE,
                           NLM_F_REQUEST | NLM_F_ACK, 1, 0)
        s.send(head + body)
        reply = s.recv(4096)
    kind = struct.unpack_from("=H", reply, 4)[0]
    if kind == NLMSG_ERROR:
        err = -struct.unpack_from("=i", reply, 16)[0]
        if err:
            raise SystemExit(f"conntrack flush failed: {os.strerror(err)}")


if __name__ == "__main__":
    main()
