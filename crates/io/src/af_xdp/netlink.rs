//! Attaching and detaching an XDP program over rtnetlink (RTM_SETLINK with
//! a nested IFLA_XDP), with the kernel's extended acks read for the reason
//! a driver refuses.

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

pub(super) fn netlink_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation.
    let fd = check(unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) })?;
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
    // struct nlmsghdr
    msg.extend_from_slice(&(total as u32).to_ne_bytes());
    msg.extend_from_slice(&libc::RTM_SETLINK.to_ne_bytes());
    msg.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence number
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
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

fn push_attr_header(msg: &mut Vec<u8>, len: usize, kind: u16) {
    msg.extend_from_slice(&(len as u16).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
}

fn ne_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
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
    match (flags & NLM_F_ACK_TLVS != 0).then(|| ack_message(tlvs)).flatten() {
        Some(message) => Err(format!("{errno} ({message})")),
        None => Err(errno.to_string()),
    }
}

fn ack_message(mut tlvs: &[u8]) -> Option<String> {
    while let (Some(len), Some(kind)) = (ne_u16(tlvs, 0), ne_u16(tlvs, 2)) {
        let len = len as usize;
        let value = tlvs.get(NLA_HDRLEN..len)?;
        if kind == NLMSGERR_ATTR_MSG {
            let text = value.split(|&b| b == 0).next().unwrap_or(value);
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        tlvs = tlvs.get(len.next_multiple_of(4)..)?;
    }
    None
}

#[cfg(test)]
mod tests {
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
}
