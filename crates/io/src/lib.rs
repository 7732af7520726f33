//! Packet I/O for natrix: capture files (pcap and pcapng in, pcapng out) for
//! `natrix replay`, and live backends (AF_XDP, AF_PACKET) that hand the
//! dataplane batches of frames: `FramePorts` lends received frames out in
//! place (AF_XDP's `XdpPorts`); `PacketPort` is one interface that copies
//! (AF_PACKET, the in-memory port (`memory`) whose other end a test drives,
//! so the dataplane runs whole without root or interfaces), adapted to
//! `FramePorts` by `CopyingPorts`.

pub mod af_packet;
pub mod af_xdp;
pub mod capture;
pub mod ethtool;
pub mod frames;
pub mod iface;
pub mod lock;
pub mod memory;
pub mod merging;
pub mod output;
pub mod port;

pub use capture::{CaptureError, CaptureReader, CaptureWriter, OneSideCapture, ReadFrame};
pub use frames::{CopyingPorts, FrameId, FramePorts, PortCounters, SharedFrames};
pub use lock::{InterfaceLock, LockError, LOCK_DIR};
pub use memory::{MemoryPeer, MemoryPort};
pub use output::{same_file, PendingFile};
pub use port::{check_frames_fit, take_socket_error, IoError, PacketPort, MAX_FRAME};
