//! The served interfaces' links, watched while natrix runs: a link that goes
//! down or comes back is said, and an interface deleted under natrix stops
//! it. Its sockets and programs went with the interface and never work
//! again, even once one of the same name is back; a natrix that forwards
//! nothing would hold its addresses (and, in a cluster, its role) all the
//! same. Stopped, it exits 1, and a service manager starts it anew once
//! the interface is back (the systemd unit restarts it on failure).

use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use natrix_io::iface::{Interface, LinkState};
use signal_hook::iterator::Handle;
use tracing::{error, info, warn};

/// How often the links are looked at.
const EVERY: Duration = Duration::from_secs(1);

/// Why the watch stopped natrix, once it has.
pub type Stopped = Arc<Mutex<Option<String>>>;

/// Starts the watch over `interfaces`. It ends natrix's wait for signals
/// (`signals`) with the reason in the answer's `Stopped` once an interface
/// is deleted, and ends itself once `signals` is closed.
pub fn start(interfaces: Vec<Interface>, signals: Handle) -> std::io::Result<(JoinHandle<()>, Stopped)> {
    let stopped = Stopped::default();
    let reason = stopped.clone();
    let watch = thread::Builder::new().name("link-watch".into()).spawn(move || watch(&interfaces, &signals, &reason))?;
    Ok((watch, stopped))
}

fn watch(interfaces: &[Interface], signals: &Handle, stopped: &Mutex<Option<String>>) {
    let mut last: Vec<LinkState> = interfaces.iter().map(|i| i.state()).collect();
    for (i, &state) in interfaces.iter().zip(&last) {
        if state == LinkState::Down {
            warn!("{}: link down at start: nothing passes through it until it is up", i.name);
        }
    }
    while !signals.is_closed() {
        thread::sleep(EVERY);
        for (i, last) in interfaces.iter().zip(&mut last) {
            let now = i.state();
            match (*last, now) {
                (was, now) if was == now => {}
                (_, LinkState::Down) => warn!("{}: link down: nothing passes through it until it is up again", i.name),
                (_, LinkState::Up) => info!("{}: link up again", i.name),
                (_, LinkState::Gone) => {
                    let reason = deleted(i);
                    error!("{reason}");
                    *stopped.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason);
                    signals.close();
                    return;
                }
            }
            *last = now;
        }
    }
}

fn deleted(i: &Interface) -> String {
    format!("{} (index {}) was deleted, and natrix's sockets on it with it: natrix stops; start it again once the interface is back", i.name, i.index)
}
