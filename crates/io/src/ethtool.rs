//! SIOCETHTOOL requests: an interface's driver, its queues (`af_xdp`), its
//! receive merging (`merging`). An interface is named in the network
//! namespace of the socket a request goes through: `request` opens one in
//! the calling thread's, a `Handle` keeps the one it was opened in.

use std::io;
use std::mem::zeroed;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const SIOCETHTOOL: libc::Ioctl = 0x8946;
const ETHTOOL_GDRVINFO: u32 = 0x03;

/// struct ethtool_drvinfo.
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// The name of the interface's driver ("veth", "mlx5_core", ...), or None
/// where it cannot be read.
pub fn driver(interface: &str) -> Option<String> {
    // SAFETY: ethtool_drvinfo is plain data; all zeroes is a valid value.
    let mut info: EthtoolDrvinfo = unsafe { zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    // SAFETY: ETHTOOL_GDRVINFO fills a struct ethtool_drvinfo.
    unsafe { request(interface, &mut info).ok()? };
    let name = info.driver.split(|&b| b == 0).next().unwrap_or_default();
    Some(String::from_utf8_lossy(name).into_owned())
}

/// One SIOCETHTOOL request for `interface` in the calling thread's
/// network namespace: `data` is the command's struct, its first field the
/// command.
///
/// # Safety
/// As for `Handle::request`.
pub(crate) unsafe fn request<T>(interface: &str, data: &mut T) -> io::Result<()> {
    // SAFETY: the caller's promise, passed on.
    unsafe { Handle::open()?.request(interface, data) }
}

/// A socket to make requests through, in the network namespace it was
/// opened in, whichever thread makes them later.
pub(crate) struct Handle(OwnedFd);

impl Handle {
    pub(crate) fn open() -> io::Result<Handle> {
        // SAFETY: a datagram socket only serves as a handle for the ioctl.
        let fd = check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: fd was just created and nothing else owns it.
        Ok(Handle(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// One SIOCETHTOOL request for `interface`.
    ///
    /// # Safety
    /// `T` must be the struct the kernel reads or writes for that command,
    /// as large.
    pub(crate) unsafe fn request<T>(&self, interface: &str, data: &mut T) -> io::Result<()> {
        let mut req = ifreq(interface)?;
        req.ifr_ifru.ifru_data = (data as *mut T).cast();
        // SAFETY: req names the interface and points at a live struct of the command's type.
        check(unsafe { libc::ioctl(self.0.as_raw_fd(), SIOCETHTOOL, &mut req as *mut libc::ifreq) })?;
        Ok(())
    }

    /// The index of `interface` in the handle's namespace.
    pub(crate) fn index_of(&self, interface: &str) -> io::Result<u32> {
        let mut req = ifreq(interface)?;
        // SAFETY: SIOCGIFINDEX reads the name and writes ifru_ifindex.
        check(unsafe { libc::ioctl(self.0.as_raw_fd(), libc::SIOCGIFINDEX, &mut req as *mut libc::ifreq) })?;
        // SAFETY: SIOCGIFINDEX filled ifru_ifindex.
        Ok(unsafe { req.ifr_ifru.ifru_ifindex } as u32)
    }
}

/// An ifreq naming `interface`.
fn ifreq(interface: &str) -> io::Result<libc::ifreq> {
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { zeroed() };
    if interface.len() >= req.ifr_name.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("interface name {interface:?} too long")));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(interface.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(req)
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}
