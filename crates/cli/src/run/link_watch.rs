//! The served interfaces' links, watched while natrix runs: a link that goes
//! down or comes back is said, as is an MTU changed under natrix, and an
//! interface deleted under natrix stops it. Its sockets and programs went
//! with the interface and never work again, even once one of the same name
//! is back; a natrix that forwards nothing would hold its addresses (and,
//! in a cluster, its role) all the same. Stopped, it exits 1, and a service
//! manager starts it anew once the interface is back (the systemd unit
//! restarts it on failure).
//!
//! Looked at once a second: an interface moved to another namespace and
//! back within that second keeps its index and looks merely down and up,
//! though natrix's sockets on it are gone.

use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use natrix_io::iface::{Interface, LinkState};
use signal_hook::iterator::Handle;
use tracing::{error, info, warn};

/// How often the links are looked at.
const EVERY: Duration = Duration::from_secs(1);

/// The watch under way.
pub struct LinkWatch {
    thread: JoinHandle<()>,
    /// Dropped to end the watch at once.
    quit: Sender<()>,
    /// Why the watch stopped natrix, once it has.
    stopped: Arc<Mutex<Option<String>>>,
}

impl LinkWatch {
    /// Starts watching `interfaces`. Once one is deleted, the watch ends
    /// natrix's wait for signals (`signals`), the reason kept for `end`.
    pub fn start(interfaces: Vec<Interface>, signals: Handle) -> std::io::Result<LinkWatch> {
        let stopped = Arc::new(Mutex::new(None));
        let reason = stopped.clone();
        let (quit, told) = mpsc::channel::<()>();
        let thread = thread::Builder::new().name("natrix-links".into()).spawn(move || {
            if let Some(r) = watch(&interfaces, || told.recv_timeout(EVERY) == Err(RecvTimeoutError::Timeout)) {
                error!("{r}");
                *reason.lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
                signals.close();
            }
        })?;
        Ok(LinkWatch { thread, quit, stopped })
    }

    /// Ends the watch; why it stopped natrix, if it did.
    pub fn end(self) -> Option<String> {
        drop(self.quit);
        let _ = self.thread.join();
        self.stopped.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Says what becomes of each link while `wait` (a second's wait, false
/// once the watch is to end) goes on; the reason to stop natrix once an
/// interface is deleted. A look the kernel cannot answer changes nothing.
fn watch(interfaces: &[Interface], mut wait: impl FnMut() -> bool) -> Option<String> {
    let mut last: Vec<(Option<LinkState>, u16)> = interfaces.iter().map(|i| (i.state(), i.mtu)).collect();
    for (i, (state, _)) in interfaces.iter().zip(&last) {
        if *state == Some(LinkState::Down) {
            warn!("{}: link down at start: nothing passes through it until it is up", i.name);
        }
    }
    while wait() {
        for (i, (last_state, last_mtu)) in interfaces.iter().zip(&mut last) {
            if let Some(mtu) = i.mtu_now().filter(|mtu| mtu != last_mtu) {
                warn!("{}", mtu_changed(i, mtu));
                *last_mtu = mtu;
            }
            let Some(now) = i.state() else { continue };
            match now {
                _ if *last_state == Some(now) => {}
                LinkState::Down => warn!("{}: link down: nothing passes through it until it is up again", i.name),
                LinkState::Up => info!("{}: link up again", i.name),
                LinkState::Gone => return Some(deleted(i)),
            }
            *last_state = Some(now);
        }
    }
    None
}

/// natrix reads an MTU once, at start: it sizes what it sends (and the
/// ICMP fragmentation needed it answers with) and the frames it takes.
fn mtu_changed(i: &Interface, mtu: u16) -> String {
    if mtu == i.mtu {
        format!("{}: MTU back to {mtu}, the one natrix uses", i.name)
    } else {
        format!(
            "{}: MTU now {mtu}; natrix goes on with the {} it read at start (what it sends, the ICMP fragmentation needed it answers, the frames it takes): restart natrix to use {mtu}",
            i.name, i.mtu
        )
    }
}

fn deleted(i: &Interface) -> String {
    format!("{} (index {}) was deleted, and natrix's sockets on it with it: natrix stops; start it again once the interface is back", i.name, i.index)
}
