//! Packet I/O for natrix: capture files (pcap and pcapng in, pcapng out) for
//! `natrix replay`, and live backends (AF_XDP, AF_PACKET) that hand the
//! dataplane batches of frames through one trait, `PacketPort`.

pub mod af_packet;
pub mod af_xdp;
pub mod capture;
pub mod iface;
pub mod port;

pub use capture::{CaptureError, CaptureReader, CaptureWriter, ReadFrame};
pub use port::{IoError, PacketPort, MAX_FRAME};
