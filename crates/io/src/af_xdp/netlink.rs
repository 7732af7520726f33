//! Attaching and detaching an XDP program over rtnetlink (RTM_SETLINK with
//! a nested IFLA_XDP), with the kernel's extended acks read for the reason
//! a driver refuses; and asking the generic netlink family "netdev" which
//! XDP features a device's driver advertises.

use std::ffi::c_void;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::{check, set_option};

// uapi/linux/if_link.h and uapi/linux/netlink.h
const IFLA_XDP: u16 = 43;
pub(super) const IFLA_XDP_FD: u16 = 1;
pub(super) const IFLA_XDP_FLAGS: u16 = 3;
pub(super) const IFLA_XDP_EXPECTED_FD: u16 = 8;
pub(super) const XDP_FLAGS_UPDATE_IF_NOEXIST: u32 = 1 << 0;
pub(super) const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
pub(super) const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
pub(super) const XDP_FLAGS_REPLACE: u32 = 1 << 4;
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_HDRLEN: usize = 4;
const NLMSG_HDRLEN: usize = 16;
const NETLINK_CAP_ACK: libc::c_int = 10;
const NETLINK_EXT_ACK: libc::c_int = 11;
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLMSGERR_ATTR_MSG: u16 = 1;

/// An rtnetlink socket, for attaching and detaching programs.
pub(super) fn netlink_socket() -> io::Result<OwnedFd> {
    open_netlink(libc::NETLINK_ROUTE)
}

fn open_netlink(protocol: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation.
    let fd = check(unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) })?;
    // SAFETY: fd was just created and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Extended acks carry the driver's reason for refusing a program;
    // capped acks leave our request out of the answer.
    set_option(&fd, libc::SOL_NETLINK, NETLINK_EXT_ACK, &1i32)?;
    set_option(&fd, libc::SOL_NETLINK, NETLINK_CAP_ACK, &1i32)?;
    Ok(fd)
}

/// RTM_SETLINK with a nested IFLA_XDP holding `attrs` (all 32-bit); on
/// failure, the errno and whatever reason the kernel gave.
pub(super) fn set_link_xdp(netlink: &OwnedFd, ifindex: u32, attrs: &[(u16, u32)]) -> Result<(), String> {
    let request = setlink_request(ifindex, attrs);
    // SAFETY: request is a readable buffer of its length; an unconnected
    // netlink socket sends to the kernel.
    let sent = unsafe { libc::send(netlink.as_raw_fd(), request.as_ptr().cast(), request.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error().to_string());
    }
    let mut answer = [0u8; 4096];
    // SAFETY: answer is writable for its length.
    let got = unsafe { libc::recv(netlink.as_raw_fd(), answer.as_mut_ptr().cast::<c_void>(), answer.len(), 0) };
    if got < 0 {
        return Err(io::Error::last_os_error().to_string());
    }
    parse_ack(&answer[..got as usize])
}

fn setlink_request(ifindex: u32, attrs: &[(u16, u32)]) -> Vec<u8> {
    let nested_len = NLA_HDRLEN + attrs.len() * (NLA_HDRLEN + 4);
    let ifinfomsg_len = size_of::<libc::ifinfomsg>();
    let total = NLMSG_HDRLEN + ifinfomsg_len + nested_len;
    let mut msg = Vec::with_capacity(total);
    push_message_header(&mut msg, total, libc::RTM_SETLINK, (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16, 1);
    // struct ifinfomsg: family AF_UNSPEC, then the index; the rest stays zero.
    let index_at = msg.len() + 4;
    msg.resize(msg.len() + ifinfomsg_len, 0);
    msg[index_at..index_at + 4].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    push_attr_header(&mut msg, nested_len, IFLA_XDP | NLA_F_NESTED);
    for &(kind, value) in attrs {
        push_attr_header(&mut msg, NLA_HDRLEN + 4, kind);
        msg.extend_from_slice(&value.to_ne_bytes());
    }
    msg
}

/// struct nlmsghdr of a request to the kernel (port id 0).
fn push_message_header(msg: &mut Vec<u8>, total: usize, kind: u16, flags: u16, seq: u32) {
    msg.extend_from_slice(&(total as u32).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
}

fn push_attr_header(msg: &mut Vec<u8>, len: usize, kind: u16) {
    msg.extend_from_slice(&(len as u16).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
}

fn ne_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn ne_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn ne_i32(bytes: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// Reads an NLMSG_ERROR answer: error 0 is the ack, anything else a
/// negative errno followed, with extended acks, by attributes such as a
/// message.
fn parse_ack(answer: &[u8]) -> Result<(), String> {
    if ne_u16(answer, 4) != Some(libc::NLMSG_ERROR as u16) {
        return Err("unexpected netlink answer".into());
    }
    let error = ne_i32(answer, NLMSG_HDRLEN).ok_or("short netlink answer")?;
    if error == 0 {
        return Ok(());
    }
    let errno = io::Error::from_raw_os_error(-error);
    let flags = ne_u16(answer, 6).unwrap_or(0);
    // Capped: nlmsgerr is the error and the request's header only.
    let tlvs = answer.get(NLMSG_HDRLEN + 4 + NLMSG_HDRLEN..).unwrap_or(&[]);
    match (flags & NLM_F_ACK_TLVS != 0).then(|| find_attr(tlvs, NLMSGERR_ATTR_MSG).ok().flatten()).flatten() {
        Some(message) => Err(format!("{errno} ({})", String::from_utf8_lossy(message.split(|&b| b == 0).next().unwrap_or(message)))),
        None => Err(errno.to_string()),
    }
}

// uapi/linux/genetlink.h: the controller that names generic families.
const GENL_ID_CTRL: u16 = 0x10;
const GENL_HDRLEN: usize = 4;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_VERSION: u8 = 1;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
// uapi/linux/netlink.h: the type bits of nla_type, without the flags.
const NLA_TYPE_MASK: u16 = 0x3fff;
// uapi/linux/netdev.h (Linux 6.3+), generated from
// Documentation/netlink/specs/netdev.yaml.
const NETDEV_FAMILY_NAME: &[u8] = b"netdev\0";
const NETDEV_FAMILY_VERSION: u8 = 1;
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;
/// enum netdev_xdp_act in uapi/linux/netdev.h: the driver implements
/// ndo_xdp_xmit, so frames an XDP program redirects from another device
/// can leave through this one.
pub(super) const NETDEV_XDP_ACT_NDO_XMIT: u64 = 1 << 2;

/// The NETDEV_XDP_ACT_* bits the driver of interface `ifindex`, in the
/// calling thread's network namespace, advertises (its xdp_features), as
/// the generic netlink family "netdev" tells them. Kernels before 6.3 have
/// no such family: an error of kind Unsupported.
pub(super) fn xdp_features(ifindex: u32) -> io::Result<u64> {
    let netlink = open_netlink(libc::NETLINK_GENERIC)?;
    let family = netdev_family(&netlink)?;
    let ifindex_attr = [(NETDEV_A_DEV_IFINDEX, &ifindex.to_ne_bytes()[..])];
    let reply = genl_request(&netlink, family, NETDEV_CMD_DEV_GET, NETDEV_FAMILY_VERSION, &ifindex_attr, 2)?;
    Ok(u64::from_ne_bytes(attr_value(&reply, NETDEV_A_DEV_XDP_FEATURES, "NETDEV_A_DEV_XDP_FEATURES")?))
}

/// The id the kernel gave the "netdev" family at boot: generic families
/// have no fixed numbers.
fn netdev_family(netlink: &OwnedFd) -> io::Result<u16> {
    let name_attr = [(CTRL_ATTR_FAMILY_NAME, NETDEV_FAMILY_NAME)];
    let reply = match genl_request(netlink, GENL_ID_CTRL, CTRL_CMD_GETFAMILY, CTRL_VERSION, &name_attr, 1) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "the kernel has no \"netdev\" generic netlink family (Linux 6.3 added it)"));
        }
        reply => reply?,
    };
    Ok(u16::from_ne_bytes(attr_value(&reply, CTRL_ATTR_FAMILY_ID, "CTRL_ATTR_FAMILY_ID")?))
}

/// Sends one generic netlink request and returns the attributes of its
/// reply; an NLMSG_ERROR answer becomes its errno.
fn genl_request(netlink: &OwnedFd, family: u16, cmd: u8, version: u8, attrs: &[(u16, &[u8])], seq: u32) -> io::Result<Vec<u8>> {
    let request = genl_message(family, cmd, version, attrs, seq);
    // SAFETY: request is a readable buffer of its length; an unconnected
    // netlink socket sends to the kernel.
    let sent = unsafe { libc::send(netlink.as_raw_fd(), request.as_ptr().cast(), request.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    // Room for the controller's family description (its operations and
    // multicast groups), the longest answer here.
    let mut answer = [0u8; 8192];
    loop {
        // SAFETY: answer is writable for its length. MSG_TRUNC returns the
        // datagram's real length, so a cut answer is noticed.
        let got = unsafe { libc::recv(netlink.as_raw_fd(), answer.as_mut_ptr().cast::<c_void>(), answer.len(), libc::MSG_TRUNC) };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        let answer = answer.get(..got as usize).ok_or_else(|| invalid("a generic netlink answer longer than 8 KiB"))?;
        if let Some(reply) = genl_reply(answer, family, seq)? {
            return Ok(reply.to_vec());
        }
    }
}

/// struct nlmsghdr, struct genlmsghdr, then each attribute padded to four
/// bytes.
fn genl_message(family: u16, cmd: u8, version: u8, attrs: &[(u16, &[u8])], seq: u32) -> Vec<u8> {
    let total = NLMSG_HDRLEN + GENL_HDRLEN + attrs.iter().map(|(_, value)| (NLA_HDRLEN + value.len()).next_multiple_of(4)).sum::<usize>();
    let mut msg = Vec::with_capacity(total);
    // No NLM_F_ACK: the reply, or an NLMSG_ERROR, is the only answer.
    push_message_header(&mut msg, total, family, libc::NLM_F_REQUEST as u16, seq);
    msg.extend_from_slice(&[cmd, version, 0, 0]);
    for &(kind, value) in attrs {
        push_attr_header(&mut msg, NLA_HDRLEN + value.len(), kind);
        msg.extend_from_slice(value);
        msg.resize(msg.len().next_multiple_of(4), 0);
    }
    msg
}

/// The attributes of the reply to request `seq` among the messages of one
/// datagram, None where it holds no answer to that request (anything else
/// is skipped: NLMSG_NOOP, NLMSG_DONE, answers to other requests).
fn genl_reply(mut answer: &[u8], family: u16, seq: u32) -> io::Result<Option<&[u8]>> {
    while !answer.is_empty() {
        let len = ne_u32(answer, 0).ok_or_else(truncated)? as usize;
        let message = answer.get(..len).filter(|_| len >= NLMSG_HDRLEN).ok_or_else(truncated)?;
        let kind = ne_u16(message, 4).ok_or_else(truncated)?;
        if ne_u32(message, 8) == Some(seq) {
            if kind == libc::NLMSG_ERROR as u16 {
                // struct nlmsgerr: a negative errno, or 0 for an ack, which
                // ends the answer: waiting on for a reply would hang.
                let error = ne_i32(message, NLMSG_HDRLEN).ok_or_else(truncated)?;
                if error == 0 {
                    return Err(invalid("the kernel acknowledged the request without a reply"));
                }
                return Err(io::Error::from_raw_os_error(error.saturating_neg()));
            } else if kind == family {
                return message.get(NLMSG_HDRLEN + GENL_HDRLEN..).map(Some).ok_or_else(truncated);
            }
        }
        answer = answer.get(len.next_multiple_of(4)..).unwrap_or(&[]);
    }
    Ok(None)
}

/// The value of attribute `kind`, which must be exactly N bytes long.
fn attr_value<const N: usize>(attrs: &[u8], kind: u16, name: &str) -> io::Result<[u8; N]> {
    let value = find_attr(attrs, kind)?.ok_or_else(|| invalid(&format!("no {name} in the kernel's answer")))?;
    value.try_into().map_err(|_| invalid(&format!("{name} of {} bytes, not {N}", value.len())))
}

/// The first attribute of type `kind` (flags in the type ignored) in a
/// generic netlink reply or an extended ack.
fn find_attr(mut attrs: &[u8], kind: u16) -> io::Result<Option<&[u8]>> {
    while !attrs.is_empty() {
        let (len, this) = ne_u16(attrs, 0).zip(ne_u16(attrs, 2)).ok_or_else(truncated)?;
        let value = attrs.get(NLA_HDRLEN..len as usize).ok_or_else(truncated)?;
        if this & NLA_TYPE_MASK == kind {
            return Ok(Some(value));
        }
        // The last attribute's padding may be left out.
        attrs = attrs.get((len as usize).next_multiple_of(4)..).unwrap_or(&[]);
    }
    Ok(None)
}

fn truncated() -> io::Error {
    invalid("a truncated netlink answer")
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

#[cfg(test)]
mod tests {
    use super::super::tests::Netns;
    use super::*;

    #[test]
    fn parses_acks_and_extended_error_messages() {
        let mut answer = vec![0u8; NLMSG_HDRLEN + 4 + NLMSG_HDRLEN];
        answer[4..6].copy_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        assert_eq!(parse_ack(&answer), Ok(()));
        answer[NLMSG_HDRLEN..NLMSG_HDRLEN + 4].copy_from_slice(&(-libc::EBUSY).to_ne_bytes());
        answer[6..8].copy_from_slice(&NLM_F_ACK_TLVS.to_ne_bytes());
        push_attr_header(&mut answer, NLA_HDRLEN + 5, NLMSGERR_ATTR_MSG);
        answer.extend_from_slice(b"busy\0\0\0\0");
        let busy = io::Error::from_raw_os_error(libc::EBUSY);
        assert_eq!(parse_ack(&answer), Err(format!("{busy} (busy)")));
    }

    /// A netlink message of `kind` answering request `seq`, holding `payload`.
    fn message(kind: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDRLEN + payload.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 2]);
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&[0; 4]);
        m.extend_from_slice(payload);
        m.resize(m.len().next_multiple_of(4), 0);
        m
    }

    #[test]
    fn requests_pad_each_attribute_to_four_bytes() {
        let msg = genl_message(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, CTRL_VERSION, &[(CTRL_ATTR_FAMILY_NAME, NETDEV_FAMILY_NAME), (7, &[1])], 9);
        // "netdev\0": a 4-byte header and 7 bytes, padded to 12; then 5 padded to 8.
        assert_eq!(msg.len(), NLMSG_HDRLEN + GENL_HDRLEN + 12 + 8);
        assert_eq!(ne_u32(&msg, 0), Some(msg.len() as u32));
        assert_eq!((ne_u16(&msg, 4), ne_u32(&msg, 8)), (Some(GENL_ID_CTRL), Some(9)));
        assert_eq!(msg[NLMSG_HDRLEN..NLMSG_HDRLEN + 2], [CTRL_CMD_GETFAMILY, CTRL_VERSION]);
        let attrs = &msg[NLMSG_HDRLEN + GENL_HDRLEN..];
        assert_eq!(ne_u16(attrs, 0), Some(11));
        assert_eq!(find_attr(attrs, CTRL_ATTR_FAMILY_NAME).unwrap(), Some(NETDEV_FAMILY_NAME));
        assert_eq!(find_attr(attrs, 7).unwrap(), Some(&[1u8][..]));
    }

    #[test]
    fn replies_skip_other_messages_and_read_errors() {
        let attrs = [8u8, 0, 1, 0, 42, 0, 0, 0];
        let reply = message(0x14, 2, &[&[1u8, 1, 0, 0][..], &attrs].concat());
        let noise = [message(libc::NLMSG_NOOP as u16, 2, &[]), message(0x14, 1, &[0; 12]), message(0x15, 2, &[0; 12])].concat();
        let answer = [noise.clone(), reply].concat();
        assert_eq!(genl_reply(&answer, 0x14, 2).unwrap(), Some(&attrs[..]));
        assert_eq!(genl_reply(&noise, 0x14, 2).unwrap(), None);

        let enodev = message(libc::NLMSG_ERROR as u16, 2, &[&(-libc::ENODEV).to_ne_bytes()[..], &[0; NLMSG_HDRLEN]].concat());
        assert_eq!(genl_reply(&enodev, 0x14, 2).unwrap_err().raw_os_error(), Some(libc::ENODEV));
        let ack = message(libc::NLMSG_ERROR as u16, 2, &[0; 4 + NLMSG_HDRLEN]);
        assert_eq!(genl_reply(&ack, 0x14, 2).unwrap_err().kind(), io::ErrorKind::InvalidData);
        let other_requests_error = message(libc::NLMSG_ERROR as u16, 1, &[&(-libc::ENODEV).to_ne_bytes()[..], &[0; NLMSG_HDRLEN]].concat());
        assert_eq!(genl_reply(&other_requests_error, 0x14, 2).unwrap(), None);
    }

    #[test]
    fn short_or_malformed_answers_are_invalid_data_not_panics() {
        let good = message(0x14, 2, &[1, 1, 0, 0, 12, 0, 3, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        for cut in 1..good.len() {
            // The message's own length now points past the datagram.
            let err = genl_reply(&good[..cut], 0x14, 2).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "cut at {cut}");
        }
        let mut zero_len = good.clone();
        zero_len[..4].copy_from_slice(&0u32.to_ne_bytes());
        assert_eq!(genl_reply(&zero_len, 0x14, 2).unwrap_err().kind(), io::ErrorKind::InvalidData);
        let no_genl_header = message(0x14, 2, &[1, 1]);
        assert_eq!(genl_reply(&no_genl_header, 0x14, 2).unwrap_err().kind(), io::ErrorKind::InvalidData);
        let short_error = message(libc::NLMSG_ERROR as u16, 2, &[]);
        assert_eq!(genl_reply(&short_error, 0x14, 2).unwrap_err().kind(), io::ErrorKind::InvalidData);

        // Attributes: a length past the end, one below the header's, a cut
        // header; a value of the wrong size.
        for attrs in [&[12u8, 0, 3, 0, 1, 2, 3, 4][..], &[2, 0, 3, 0], &[0, 0, 3, 0], &[8, 0]] {
            assert_eq!(find_attr(attrs, 3).unwrap_err().kind(), io::ErrorKind::InvalidData, "{attrs:?}");
        }
        let short_u64 = [8u8, 0, 3, 0, 1, 2, 3, 4];
        assert_eq!(attr_value::<8>(&short_u64, 3, "x").unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert_eq!(attr_value::<4>(&short_u64, 4, "x").unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert_eq!(attr_value::<4>(&short_u64, 3, "x").unwrap(), [1, 2, 3, 4]);
    }

    #[test]
    fn attributes_are_found_past_padding_and_pad_attributes() {
        // NETDEV_A_DEV_IFINDEX (u32), NETDEV_A_DEV_PAD (empty, where the
        // kernel aligns a u64), a 5-byte attribute padded to 8, then the
        // u64, its type carrying NLA_F_NET_BYTEORDER, which is ignored.
        let mut attrs = vec![8, 0, 1, 0, 7, 0, 0, 0, 4, 0, 2, 0, 5, 0, 9, 0, 0xee, 0, 0, 0];
        attrs.extend_from_slice(&12u16.to_ne_bytes());
        attrs.extend_from_slice(&(NETDEV_A_DEV_XDP_FEATURES | 1 << 14).to_ne_bytes());
        attrs.extend_from_slice(&0x47u64.to_ne_bytes());
        assert_eq!(attr_value::<8>(&attrs, NETDEV_A_DEV_XDP_FEATURES, "x").map(u64::from_ne_bytes).unwrap(), 0x47);
        assert_eq!(find_attr(&attrs, 9).unwrap(), Some(&[0xee][..]));
        assert_eq!(find_attr(&attrs, 6).unwrap(), None);
    }

    // enum netdev_xdp_act in uapi/linux/netdev.h.
    const NETDEV_XDP_ACT_BASIC: u64 = 1 << 0;
    const NETDEV_XDP_ACT_REDIRECT: u64 = 1 << 1;
    /// The veth pair of the test's namespace.
    const A: &str = "nxft-a";
    const B: &str = "nxft-b";

    /// veth advertises ndo_xdp_xmit on a device only while its peer has
    /// NAPI to receive such frames: an XDP program or GRO (drivers/net/
    /// veth.c: veth_set_xdp_features, and veth_set_features, which updates
    /// the flag only while the peer is up; so both ends are up first).
    #[test]
    fn veth_advertises_ndo_xmit_while_its_peer_has_gro() {
        let Some(ns) = Netns::empty("veth") else {
            return;
        };
        ns.ip(&["link", "add", "name", A, "type", "veth", "peer", "name", B]);
        ns.ip(&["link", "set", A, "up"]);
        ns.ip(&["link", "set", B, "up"]);
        ns.ethtool(&["-K", B, "gro", "off"]);
        let features_of_a = || ns.run(|| xdp_features(ifindex(A)).expect("xdp_features of the first end"));

        let off = features_of_a();
        let both = NETDEV_XDP_ACT_BASIC | NETDEV_XDP_ACT_REDIRECT;
        assert_eq!(off & both, both, "{off:#x}");
        assert_eq!(off & NETDEV_XDP_ACT_NDO_XMIT, 0, "ndo_xdp_xmit while the peer has no GRO: {off:#x}");

        ns.ethtool(&["-K", B, "gro", "on"]);
        let on = features_of_a();
        assert_ne!(on & NETDEV_XDP_ACT_NDO_XMIT, 0, "no ndo_xdp_xmit while the peer has GRO: {on:#x}");

        ns.ethtool(&["-K", B, "gro", "off"]);
        let off_again = features_of_a();
        assert_eq!(off_again & NETDEV_XDP_ACT_NDO_XMIT, 0, "ndo_xdp_xmit after the peer's GRO is off again: {off_again:#x}");
    }

    #[test]
    fn a_missing_interface_is_an_error() {
        let Some(ns) = Netns::empty("missing") else {
            return;
        };
        let err = ns.run(|| xdp_features(0x7fff_fff0)).expect_err("no interface has that index");
        assert_eq!(err.raw_os_error(), Some(libc::ENODEV), "{err}");
    }

    fn ifindex(name: &str) -> u32 {
        let name = std::ffi::CString::new(name).unwrap();
        // SAFETY: name is a valid C string.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert_ne!(index, 0, "{name:?}: {}", io::Error::last_os_error());
        index
    }
}
