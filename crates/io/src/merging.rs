//! GRO and LRO off on an interface AF_PACKET serves, while natrix runs.
//!
//! A packet socket gets what GRO or LRO merged, up to 64 KiB of one TCP
//! flow, as one frame. natrix forwards frames as they crossed the wire,
//! at most `MAX_FRAME` bytes, so it would refuse every merged one and the
//! flow would stall. AF_XDP needs none of this: its programs run before
//! GRO. Turning GRO off turns the NIC's own GRO (rx-gro-hw) off with it.
//! What natrix turned off goes back on when it stops cleanly, unless
//! someone turned it on again meanwhile; after a kill it stays off.
//! Merging on a device below the interface (a VLAN's or a bond's) is not
//! seen here.

use std::io;

use crate::ethtool::Handle;

const ETHTOOL_GFLAGS: u32 = 0x25;
const ETHTOOL_SFLAGS: u32 = 0x26;
const ETHTOOL_GGRO: u32 = 0x2b;
const ETHTOOL_SGRO: u32 = 0x2c;
const ETH_FLAG_LRO: u32 = 1 << 15;

/// struct ethtool_value.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// A kind of receive merging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    Gro,
    Lro,
}

impl Merge {
    fn name(self) -> &'static str {
        match self {
            Merge::Gro => "GRO",
            Merge::Lro => "LRO",
        }
    }

    fn is_on(self, handle: &Handle, interface: &str) -> io::Result<bool> {
        match self {
            Merge::Gro => Ok(value(handle, interface, ETHTOOL_GGRO)? != 0),
            Merge::Lro => Ok(value(handle, interface, ETHTOOL_GFLAGS)? & ETH_FLAG_LRO != 0),
        }
    }

    /// Only LRO's bit of the flags changes.
    fn set(self, handle: &Handle, interface: &str, on: bool) -> io::Result<()> {
        match self {
            Merge::Gro => set_value(handle, interface, ETHTOOL_SGRO, u32::from(on)),
            Merge::Lro => {
                let flags = value(handle, interface, ETHTOOL_GFLAGS)? & !ETH_FLAG_LRO;
                set_value(handle, interface, ETHTOOL_SFLAGS, flags | if on { ETH_FLAG_LRO } else { 0 })
            }
        }
    }
}

/// What became of an interface's receive merging.
#[derive(Debug, PartialEq, Eq)]
pub enum Merging {
    /// Off already.
    Off,
    /// Turned off by natrix, until it stops.
    TurnedOff(Vec<Merge>),
    /// Still on, or unknown: why, and what was turned off all the same.
    Failed { why: String, turned_off: Vec<Merge> },
}

/// Receive merging natrix turned off on an interface, turned back on when
/// dropped: through the socket it was turned off through, so on the same
/// interface whatever thread or namespace drops it, and only while the
/// name still has the index it had.
pub struct MergingOff {
    handle: Option<Handle>,
    interface: String,
    ifindex: u32,
    outcome: Merging,
}

impl MergingOff {
    /// Turns GRO and LRO off on `interface` (`ifindex`) where they are on.
    pub fn apply(interface: &str, ifindex: u32) -> MergingOff {
        let handle = Handle::open();
        let outcome = match &handle {
            Ok(handle) => turn_off(handle, interface),
            Err(e) => Merging::Failed { why: format!("opening a socket: {e}"), turned_off: Vec::new() },
        };
        MergingOff { handle: handle.ok(), interface: interface.to_owned(), ifindex, outcome }
    }

    /// What became of the interface's receive merging.
    pub fn outcome(&self) -> &Merging {
        &self.outcome
    }
}

/// Turns GRO and LRO off on `interface` where they are on, through `handle`.
fn turn_off(handle: &Handle, interface: &str) -> Merging {
    let (mut turned_off, mut failures) = (Vec::new(), Vec::new());
    for merge in [Merge::Gro, Merge::Lro] {
        match merge.is_on(handle, interface).map(|on| on.then(|| merge.set(handle, interface, false))) {
            Ok(None) => {}
            Ok(Some(Ok(()))) => turned_off.push(merge),
            Ok(Some(Err(e))) => failures.push(format!("turning {} off: {e}", merge.name())),
            Err(e) => failures.push(format!("reading {}: {e}", merge.name())),
        }
    }
    match (failures.is_empty(), turned_off.is_empty()) {
        (true, true) => Merging::Off,
        (true, false) => Merging::TurnedOff(turned_off),
        (false, _) => Merging::Failed { why: failures.join("; "), turned_off },
    }
}

impl Merging {
    /// What natrix turned off, to put back.
    fn turned_off(&self) -> &[Merge] {
        match self {
            Merging::Off => &[],
            Merging::TurnedOff(merges) | Merging::Failed { turned_off: merges, .. } => merges,
        }
    }
}

impl Drop for MergingOff {
    fn drop(&mut self) {
        let Some(handle) = &self.handle else { return };
        // An interface gone or renamed since has nothing to put back.
        if handle.index_of(&self.interface).ok() != Some(self.ifindex) {
            return;
        }
        for &merge in self.outcome.turned_off() {
            if merge.is_on(handle, &self.interface).ok() == Some(false) {
                let _ = merge.set(handle, &self.interface, true);
            }
        }
    }
}

/// What an operator reads at start-up about an interface's receive
/// merging; None where there was nothing to do.
pub fn describe(interface: &str, merging: &Merging) -> Option<String> {
    let names = |merges: &[Merge]| merges.iter().map(|m| m.name()).collect::<Vec<_>>().join(" and ");
    match merging {
        Merging::Off => None,
        Merging::TurnedOff(merges) => {
            Some(format!("{interface}: {} off while natrix runs, as AF_PACKET would get what it merges as one frame, too long to forward; back on at stop", names(merges)))
        }
        Merging::Failed { why, turned_off } => {
            let done = if turned_off.is_empty() { String::new() } else { format!(" ({} turned off, back on at stop)", names(turned_off)) };
            Some(format!(
                "{interface}: receive merging may be on ({why}){done}; AF_PACKET then gets merged TCP segments, which natrix refuses (rx_refused_total): `ethtool -K {interface} gro off lro off`"
            ))
        }
    }
}

fn value(handle: &Handle, interface: &str, cmd: u32) -> io::Result<u32> {
    let mut v = EthtoolValue { cmd, data: 0 };
    // SAFETY: the G commands used here fill a struct ethtool_value.
    unsafe { handle.request(interface, &mut v)? };
    Ok(v.data)
}

fn set_value(handle: &Handle, interface: &str, cmd: u32, data: u32) -> io::Result<()> {
    let mut v = EthtoolValue { cmd, data };
    // SAFETY: the S commands used here read a struct ethtool_value.
    unsafe { handle.request(interface, &mut v) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::af_xdp::tests::Netns;

    /// What `ethtool -k` says of the interface's GRO: "on" or "off".
    fn gro_shown(ns: &Netns, interface: &str) -> String {
        let out = std::process::Command::new("ip").args(["netns", "exec", &ns.name, "ethtool", "-k", interface]).output().expect("ethtool runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.starts_with("generic-receive-offload:")).expect("ethtool shows GRO");
        line.split_whitespace().nth(1).expect("a state").to_owned()
    }

    fn index_of(ns: &Netns, interface: &str) -> u32 {
        let out = ns.ip(&["-o", "link", "show", interface]);
        out.split(':').next().and_then(|i| i.trim().parse().ok()).expect("ip shows the index")
    }

    #[test]
    fn an_interface_renamed_or_replaced_meanwhile_is_left_alone() {
        let Some(ns) = veth_with_gro("merging-gone", "on") else { return };
        let off = ns.run(|| MergingOff::apply("m0", index_of(&ns, "m0")));
        // Another interface under the name, GRO off: not natrix's to change.
        ns.ip(&["link", "del", "m0"]);
        ns.ip(&["link", "add", "m0", "type", "veth", "peer", "name", "m2"]);
        ns.ethtool(&["-K", "m0", "gro", "off"]);
        drop(off);
        assert_eq!(gro_shown(&ns, "m0"), "off");
    }

    fn veth_with_gro(tag: &str, gro: &str) -> Option<Netns> {
        let ns = Netns::empty(tag)?;
        ns.ip(&["link", "add", "m0", "type", "veth", "peer", "name", "m1"]);
        ns.ethtool(&["-K", "m0", "gro", gro]);
        assert_eq!(gro_shown(&ns, "m0"), gro);
        Some(ns)
    }

    #[test]
    fn gro_is_off_while_held_and_on_again_after() {
        let Some(ns) = veth_with_gro("merging-on", "on") else { return };
        let off = ns.run(|| MergingOff::apply("m0", index_of(&ns, "m0")));
        assert_eq!(off.outcome(), &Merging::TurnedOff(vec![Merge::Gro]));
        assert_eq!(gro_shown(&ns, "m0"), "off");
        let note = describe("m0", off.outcome()).expect("a note");
        assert!(note.starts_with("m0: GRO off while natrix runs"), "{note}");
        // Dropped outside the namespace, as a port opened in one and
        // dropped by a thread in another is: still put back there.
        drop(off);
        assert_eq!(gro_shown(&ns, "m0"), "on", "put back at drop");
    }

    #[test]
    fn gro_found_off_is_left_off_and_says_nothing() {
        let Some(ns) = veth_with_gro("merging-off", "off") else { return };
        let off = ns.run(|| MergingOff::apply("m0", index_of(&ns, "m0")));
        assert_eq!(off.outcome(), &Merging::Off);
        assert_eq!(describe("m0", off.outcome()), None);
        ns.run(|| drop(off));
        assert_eq!(gro_shown(&ns, "m0"), "off", "natrix turns on nothing it did not turn off");
    }

    #[test]
    fn an_interface_that_is_not_there_is_said_to_fail() {
        let Some(ns) = Netns::empty("merging-none") else { return };
        let off = ns.run(|| MergingOff::apply("nx-none0", 999));
        let Merging::Failed { why, .. } = off.outcome() else { panic!("{:?}", off.outcome()) };
        assert!(why.starts_with("reading GRO"), "{why}");
        let note = describe("nx-none0", off.outcome()).expect("a note");
        assert!(note.contains("ethtool -K nx-none0 gro off lro off"), "{note}");
    }
}
