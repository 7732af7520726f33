//! GRO and LRO off on an interface AF_PACKET serves, while natrix runs.
//!
//! A packet socket gets what GRO or LRO merged, up to 64 KiB of one TCP
//! flow, as one frame. natrix forwards frames as they crossed the wire,
//! at most `MAX_FRAME` bytes, so it would refuse every merged one and the
//! flow would stall. AF_XDP needs none of this: its programs run before
//! GRO, and the kernel turns LRO off for them. Turning GRO off turns the
//! NIC's own GRO (rx-gro-hw) off with it. What natrix turned off goes back
//! on when it stops, unless someone turned it on again meanwhile.

use std::io;

use crate::ethtool;

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

    fn is_on(self, interface: &str) -> io::Result<bool> {
        match self {
            Merge::Gro => Ok(value(interface, ETHTOOL_GGRO)? != 0),
            Merge::Lro => Ok(value(interface, ETHTOOL_GFLAGS)? & ETH_FLAG_LRO != 0),
        }
    }

    fn set(self, interface: &str, on: bool) -> io::Result<()> {
        match self {
            Merge::Gro => set_value(interface, ETHTOOL_SGRO, u32::from(on)),
            Merge::Lro => {
                let flags = value(interface, ETHTOOL_GFLAGS)? & !ETH_FLAG_LRO;
                set_value(interface, ETHTOOL_SFLAGS, flags | if on { ETH_FLAG_LRO } else { 0 })
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
    /// Still on, or unknown: why.
    Failed(String),
}

/// Receive merging natrix turned off on an interface, turned back on when
/// dropped.
pub struct MergingOff {
    interface: String,
    turned_off: Vec<Merge>,
}

impl MergingOff {
    /// Turns GRO and LRO off on `interface` where they are on.
    pub fn apply(interface: &str) -> (MergingOff, Merging) {
        let mut off = MergingOff { interface: interface.to_owned(), turned_off: Vec::new() };
        for merge in [Merge::Gro, Merge::Lro] {
            match merge.is_on(interface) {
                Ok(false) => {}
                Ok(true) => match merge.set(interface, false) {
                    Ok(()) => off.turned_off.push(merge),
                    Err(e) => return (off, Merging::Failed(format!("turning {} off: {e}", merge.name()))),
                },
                // A device without LRO may not answer for it at all.
                Err(_) if merge == Merge::Lro => {}
                Err(e) => return (off, Merging::Failed(format!("reading {}: {e}", merge.name()))),
            }
        }
        let outcome = if off.turned_off.is_empty() { Merging::Off } else { Merging::TurnedOff(off.turned_off.clone()) };
        (off, outcome)
    }
}

impl Drop for MergingOff {
    fn drop(&mut self) {
        for &merge in &self.turned_off {
            // Best effort: an interface gone since has nothing to put back.
            if merge.is_on(&self.interface).ok() == Some(false) {
                let _ = merge.set(&self.interface, true);
            }
        }
    }
}

/// What an operator reads at start-up about an interface's receive
/// merging; None where there was nothing to do.
pub fn describe(interface: &str, merging: &Merging) -> Option<String> {
    match merging {
        Merging::Off => None,
        Merging::TurnedOff(merges) => {
            let names: Vec<&str> = merges.iter().map(|m| m.name()).collect();
            Some(format!(
                "{interface}: {} off while natrix runs, as AF_PACKET would get what it merges as one frame, too long to forward; back on at stop",
                names.join(" and ")
            ))
        }
        Merging::Failed(why) => Some(format!(
            "{interface}: receive merging may be on ({why}); AF_PACKET then gets merged TCP segments, which natrix refuses (rx_refused_total): `ethtool -K {interface} gro off lro off`"
        )),
    }
}

fn value(interface: &str, cmd: u32) -> io::Result<u32> {
    let mut v = EthtoolValue { cmd, data: 0 };
    // SAFETY: the G commands used here fill a struct ethtool_value.
    unsafe { ethtool::request(interface, &mut v)? };
    Ok(v.data)
}

fn set_value(interface: &str, cmd: u32, data: u32) -> io::Result<()> {
    let mut v = EthtoolValue { cmd, data };
    // SAFETY: the S commands used here read a struct ethtool_value.
    unsafe { ethtool::request(interface, &mut v) }
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
        let (off, outcome) = ns.run(|| MergingOff::apply("m0"));
        assert_eq!(outcome, Merging::TurnedOff(vec![Merge::Gro]));
        assert_eq!(gro_shown(&ns, "m0"), "off");
        let note = describe("m0", &outcome).expect("a note");
        assert!(note.starts_with("m0: GRO off while natrix runs"), "{note}");
        ns.run(|| drop(off));
        assert_eq!(gro_shown(&ns, "m0"), "on", "put back at drop");
    }

    #[test]
    fn gro_found_off_is_left_off_and_says_nothing() {
        let Some(ns) = veth_with_gro("merging-off", "off") else { return };
        let (off, outcome) = ns.run(|| MergingOff::apply("m0"));
        assert_eq!(outcome, Merging::Off);
        assert_eq!(describe("m0", &outcome), None);
        ns.run(|| drop(off));
        assert_eq!(gro_shown(&ns, "m0"), "off", "natrix turns on nothing it did not turn off");
    }

    #[test]
    fn an_interface_that_is_not_there_is_said_to_fail() {
        let Some(ns) = Netns::empty("merging-none") else { return };
        let (_off, outcome) = ns.run(|| MergingOff::apply("nx-none0"));
        let Merging::Failed(why) = &outcome else { panic!("{outcome:?}") };
        assert!(why.starts_with("reading GRO"), "{why}");
        let note = describe("nx-none0", &outcome).expect("a note");
        assert!(note.contains("ethtool -K nx-none0 gro off lro off"), "{note}");
    }
}
