//! Opening the tester's ports: AF_XDP where the interface takes it, else
//! AF_PACKET (as `natrix run`'s `io = "auto"` does), and a port that is
//! connected to nothing for a generator that only sends or only receives.

use std::os::fd::RawFd;

use natrix_io::af_packet::AfPacketPort;
use natrix_io::af_xdp::AfXdpPort;
use natrix_io::iface::Interface;
use natrix_io::{IoError, PacketPort};

/// Which packet backend to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Io {
    /// AF_XDP, falling back to AF_PACKET.
    Auto,
    AfXdp,
    AfPacket,
}

/// An open port with its interface's MAC, and why it fell back, if it did.
pub struct Opened {
    pub port: Box<dyn PacketPort>,
    pub mac: [u8; 6],
    pub fallback: Option<String>,
}

pub fn open(interface: &str, io: Io) -> Result<Opened, IoError> {
    let iface = Interface::lookup(interface)?;
    let (port, fallback): (Box<dyn PacketPort>, _) = match io {
        Io::AfPacket => (Box::new(AfPacketPort::open(&iface)?), None),
        Io::AfXdp => (Box::new(AfXdpPort::open(interface)?), None),
        Io::Auto => match AfXdpPort::open(interface) {
            Ok(p) => (Box::new(p), None),
            Err(e) => (Box::new(AfPacketPort::open(&iface)?), Some(format!("AF_XDP unavailable ({e}); using AF_PACKET on {interface}"))),
        },
    };
    Ok(Opened { port, mac: iface.mac, fallback })
}

/// A port on no wire: it receives nothing and discards what it is given.
/// Its descriptor is -1, which poll() skips.
pub struct Unconnected;

impl PacketPort for Unconnected {
    fn recv_batch(&mut self, _max: usize, _f: &mut dyn FnMut(&mut [u8])) -> Result<usize, IoError> {
        Ok(0)
    }

    fn send(&mut self, _frame: &[u8]) -> bool {
        true
    }

    fn flush(&mut self) -> Result<(), IoError> {
        Ok(())
    }

    fn fd(&self) -> RawFd {
        -1
    }

    fn backend(&self) -> &'static str {
        "none"
    }
}
