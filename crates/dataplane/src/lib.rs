//! natrix's live dataplane: the engine on real interfaces.
//!
//! `gateway` is the router around the NAT (ARP and Neighbor Discovery, next
//! hops, Ethernet addresses), `steer` decides which worker owns a frame,
//! `ring` hands frames between threads without locks, and `runtime` runs
//! the threads and gives the control plane a handle to them. Packet I/O
//! itself is natrix-io's; `Dataplane::start_with` also takes ports the
//! caller opened, such as natrix-io's in-memory ports in tests.

pub mod gateway;
pub mod ring;
pub mod runtime;
pub mod steer;

pub use natrix_io::af_xdp::XdpAttach;
pub use runtime::{
    ControlError, Dataplane, DataplaneError, DeviceDeferral, IoChoice, IoSnapshot, LinkSettings, Logged, OffloadReturned, Offloading, Only, Settings, StartOptions, State,
    SuppliedPort, SyncTally, WorkerSnapshot, PORT_USE_THRESHOLDS,
};
