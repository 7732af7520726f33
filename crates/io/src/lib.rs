//! Packet I/O for natrix. Today: capture files (pcap and pcapng in, pcapng
//! out) for `natrix replay`. Live backends (AF_PACKET, AF_XDP) will live next
//! to `capture` and hand the engine the same thing: a frame, the side it
//! arrived on, and a time.

pub mod capture;

pub use capture::{CaptureError, CaptureReader, CaptureWriter, ReadFrame};
