//! What natrix needs to know about a network interface: its index, hardware
//! address and MTU, read from the kernel once at start.

use std::ffi::CString;

use crate::port::IoError;

#[derive(Debug, Clone)]
pub struct Interface {
    pub name: String,
    pub index: u32,
    pub mac: [u8; 6],
    pub mtu: u16,
}

impl Interface {
    pub fn lookup(name: &str) -> Result<Interface, IoError> {
        let cname = CString::new(name).map_err(|_| IoError::Unsupported { interface: name.to_owned(), reason: "interface name contains a NUL byte".into() })?;
        // SAFETY: cname is a valid NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if index == 0 {
            return Err(IoError::Os { op: "finding the interface", interface: name.to_owned(), source: std::io::Error::last_os_error() });
        }
        let mut req = ifreq(name)?;
        ioctl(name, libc::SIOCGIFHWADDR, &mut req, "reading the hardware address")?;
        // SAFETY: SIOCGIFHWADDR filled ifru_hwaddr.
        let hw = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
        let mac = [hw[0] as u8, hw[1] as u8, hw[2] as u8, hw[3] as u8, hw[4] as u8, hw[5] as u8];
        let mut req = ifreq(name)?;
        ioctl(name, libc::SIOCGIFMTU, &mut req, "reading the MTU")?;
        // SAFETY: SIOCGIFMTU filled ifru_mtu.
        let mtu = unsafe { req.ifr_ifru.ifru_mtu };
        Ok(Interface { name: name.to_owned(), index, mac, mtu: mtu.clamp(68, 65535) as u16 })
    }
}

/// What became of an interface natrix opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Administratively up, with a carrier.
    Up,
    /// Set down, or without a carrier.
    Down,
    /// Deleted: no interface has its index any more. Sockets bound to it
    /// never work again, even once an interface of its name is back.
    Gone,
}

impl Interface {
    /// The interface's state now, found by its index (a renamed interface
    /// is still the one natrix opened); None where the kernel could not be
    /// asked (out of file descriptors, say), which says nothing about it.
    pub fn state(&self) -> Option<LinkState> {
        let Some(name) = self.name_now() else {
            // No such index: ENXIO (glibc's word for the kernel's ENODEV).
            return no_such_device(&std::io::Error::last_os_error()).then_some(LinkState::Gone);
        };
        let mut req = ifreq(&name).ok()?;
        // A failure here, the index just found, is a rename or a deletion
        // in between: the next look tells.
        ioctl(&name, libc::SIOCGIFFLAGS, &mut req, "reading the flags").ok()?;
        // SAFETY: SIOCGIFFLAGS filled ifru_flags.
        let flags = i32::from(unsafe { req.ifr_ifru.ifru_flags });
        let up = libc::IFF_UP | libc::IFF_RUNNING;
        Some(if flags & up == up { LinkState::Up } else { LinkState::Down })
    }

    /// The interface's MTU now, where it can be read.
    pub fn mtu_now(&self) -> Option<u16> {
        let name = self.name_now()?;
        let mut req = ifreq(&name).ok()?;
        ioctl(&name, libc::SIOCGIFMTU, &mut req, "reading the MTU").ok()?;
        // SAFETY: SIOCGIFMTU filled ifru_mtu.
        Some(unsafe { req.ifr_ifru.ifru_mtu }.clamp(68, 65535) as u16)
    }

    /// The name its index has now; None (errno set) where it has none.
    fn name_now(&self) -> Option<String> {
        let mut name = [0 as libc::c_char; libc::IFNAMSIZ];
        // SAFETY: name has the IFNAMSIZ bytes if_indextoname writes at most.
        if unsafe { libc::if_indextoname(self.index, name.as_mut_ptr()) }.is_null() {
            return None;
        }
        // SAFETY: if_indextoname wrote a NUL-terminated name.
        Some(unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned())
    }
}

fn no_such_device(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENXIO | libc::ENODEV))
}

fn ifreq(name: &str) -> Result<libc::ifreq, IoError> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(IoError::Unsupported { interface: name.to_owned(), reason: format!("interface names are at most {} bytes", libc::IFNAMSIZ - 1) });
    }
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(req)
}

fn ioctl(name: &str, request: libc::Ioctl, req: &mut libc::ifreq, op: &'static str) -> Result<(), IoError> {
    // SAFETY: a datagram socket only serves as a handle for interface ioctls.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(IoError::os("opening a control socket", name));
    }
    // SAFETY: req is a valid ifreq for these requests.
    let rc = unsafe { libc::ioctl(fd, request, req as *mut libc::ifreq) };
    let err = IoError::os(op, name);
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return Err(err);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_found_with_its_mtu() {
        let lo = Interface::lookup("lo").expect("every Linux host has lo");
        assert!(lo.index > 0);
        assert!(lo.mtu >= 1500);
        assert_eq!(lo.mac, [0; 6]);
    }

    #[test]
    fn missing_interface_is_named_in_the_error() {
        let e = Interface::lookup("nx-no-such0").unwrap_err().to_string();
        assert!(e.contains("nx-no-such0"), "{e}");
    }

    #[test]
    fn a_link_is_up_then_down_without_its_peer_still_itself_renamed_and_gone_once_deleted() {
        let Some(ns) = crate::af_xdp::tests::Netns::empty("iface-state") else { return };
        ns.ip(&["link", "add", "nx-a", "type", "veth", "peer", "name", "nx-b"]);
        ns.ip(&["link", "set", "nx-a", "up"]);
        ns.ip(&["link", "set", "nx-b", "up"]);
        let a = ns.run(|| Interface::lookup("nx-a")).expect("nx-a");
        let state = || ns.run(|| a.state()).expect("the kernel answers");
        assert_eq!(state(), LinkState::Up);
        // No carrier: the peer is down.
        ns.ip(&["link", "set", "nx-b", "down"]);
        assert_eq!(state(), LinkState::Down);
        ns.ip(&["link", "set", "nx-b", "up"]);
        ns.ip(&["link", "set", "nx-a", "down"]);
        assert_eq!(state(), LinkState::Down);
        ns.ip(&["link", "set", "nx-a", "name", "nx-c", "up"]);
        assert_eq!(state(), LinkState::Up, "renamed, still the interface natrix opened");
        assert_eq!(ns.run(|| a.mtu_now()), Some(1500));
        ns.ip(&["link", "set", "nx-c", "mtu", "1400"]);
        assert_eq!(ns.run(|| a.mtu_now()), Some(1400), "read again, under its new name");
        ns.ip(&["link", "del", "nx-c"]);
        assert_eq!(state(), LinkState::Gone);
        // Another of the old name is not the one natrix opened.
        ns.ip(&["link", "add", "nx-a", "type", "veth", "peer", "name", "nx-b"]);
        assert_eq!(state(), LinkState::Gone);
    }
}
