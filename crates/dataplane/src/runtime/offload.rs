//! A worker's side of the XDP offload (`natrix_io::af_xdp::offload`): which
//! of its flows the program forwards by itself, learnt from the frames the
//! engine translates, and taken back when the engine would now do
//! something else with them.
//!
//! A flow direction goes into the program's table once the engine has
//! translated `LEARN_AFTER` of its frames, the last with the plain rewrite
//! while its session was steady (`Engine::may_offload`). Short flows, most of a busy
//! CGN's, cost one counter in a small table (`Recent`), no system call and
//! no session lookup. Once a second (`SWEEP_NS`), a slice at a time, the
//! worker reads how many frames the program forwarded of each of its flows
//! and has the engine refresh the sessions of those that had any, as the
//! frames would have.
//! A flow comes out of the table when a frame of it reaching the engine
//! (one the program never takes: a FIN, a RST) is no longer translated so,
//! when the engine no longer has it steady at a sweep, after `IDLE_NS`
//! without a frame, or once the interface it leaves by no longer takes
//! redirected frames (`Redirects`).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use natrix_engine::{Engine, FrameBuf, Side, Verdict};
use natrix_io::af_xdp::offload::{self, Egress, FlowAction, FlowKey, Head, Offload};

use crate::gateway::moves::{MoveLog, Since};
use crate::gateway::Gateway;

/// Frames of a flow direction the engine translates before the program
/// takes over.
const LEARN_AFTER: u8 = 8;
/// A flow direction the program has forwarded no frame of for this long
/// goes back to the engine.
const IDLE_NS: u64 = 10_000_000_000;
/// How often the sessions of offloaded flows are refreshed, and idle flows
/// looked for: also the longest a flow stays offloaded after its session
/// ended some other way than by a FIN or RST, a clear or a reload (a
/// mapping a PCP client deleted).
const SWEEP_NS: u64 = 1_000_000_000;
/// Flow directions a sweep goes through per round of the worker's loop at
/// least: a session refresh each, so that a busy worker with many flows
/// spreads them out rather than stopping for all of them at once. An idle
/// worker, whose rounds come only as often as it wakes, takes more per
/// round, so that every sweep still ends within `SWEEP_NS`.
const SWEEP_SLICE: usize = 256;
/// Slots of the counters of flows not yet learnt.
const RECENT_SLOTS: usize = 1 << 16;

/// The offload's table and what it needs to know of the two interfaces.
#[derive(Clone)]
pub(crate) struct OffloadTable {
    pub(crate) map: Arc<Offload>,
    pub(crate) ifindex: [u32; 2],
    /// Whether each interface's driver takes frames redirected to it.
    pub(crate) redirects: Arc<Redirects>,
    /// The longest datagram each interface takes (its MTU; 0: no limit).
    pub(crate) mtu: [u16; 2],
}

/// Whether each interface takes frames redirected to it from XDP, as last
/// read: read again once a second, by whichever worker's sweep comes
/// first. A veth stops taking them when its peer's GRO goes off, and the
/// kernel then drops what the program sends there; within a sweep of the
/// next read, the flows to it are back with the workers.
pub(crate) struct Redirects {
    ifindex: [u32; 2],
    taken: [AtomicBool; 2],
    next_read: AtomicU64,
    read: fn(u32) -> io::Result<bool>,
}

impl Redirects {
    /// `taken` as read at start; `read` reads an interface's again.
    pub(crate) fn new(ifindex: [u32; 2], taken: [bool; 2], read: fn(u32) -> io::Result<bool>) -> Redirects {
        Redirects { ifindex, taken: taken.map(AtomicBool::new), next_read: AtomicU64::new(0), read }
    }

    pub(crate) fn taken(&self, side: Side) -> bool {
        self.taken[side as usize].load(Relaxed)
    }

    /// Reads both interfaces again if a second has passed since the last
    /// read (the first caller to see it does). A failed read leaves the
    /// last answer.
    fn read_again(&self, now: u64) {
        let due = self.next_read.load(Relaxed);
        if now < due || self.next_read.compare_exchange(due, now + SWEEP_NS, Relaxed, Relaxed).is_err() {
            return;
        }
        for (taken, &ifindex) in self.taken.iter().zip(&self.ifindex) {
            if let Ok(now_taken) = (self.read)(ifindex) {
                taken.store(now_taken, Relaxed);
            }
        }
    }
}

/// The table, and the next hops' addresses the frames it forwards get.
#[derive(Clone)]
pub(crate) struct OffloadPlan {
    table: OffloadTable,
    gateway: Arc<Mutex<Gateway>>,
    /// The next hops that moved (`Gateway::moves`).
    moves: Arc<MoveLog>,
}

impl OffloadPlan {
    pub(crate) fn new(table: OffloadTable, gateway: Arc<Mutex<Gateway>>) -> OffloadPlan {
        let moves = gateway.lock().unwrap_or_else(std::sync::PoisonError::into_inner).moves();
        OffloadPlan { table, gateway, moves }
    }

    /// The Ethernet addresses of frames to `dst` leaving on `side`, where
    /// its next hop is known fresh.
    fn ethernet_to(&self, side: Side, dst: u32, now: u64) -> Option<[u8; 12]> {
        self.gateway.lock().ok()?.ethernet_to(side, dst, now)
    }

    /// Where the flows leaving on `side` go, and which counter they count in.
    fn egress(&self, side: Side) -> Egress {
        let mtu = self.table.mtu[side as usize];
        Egress { ifindex: self.table.ifindex[side as usize], counter: side as u32, max_len: if mtu == 0 { u16::MAX } else { mtu } }
    }

    /// Whether each side takes the frames the program redirects to it.
    pub(crate) fn redirects_taken(&self) -> [bool; 2] {
        [Side::Inside, Side::Outside].map(|side| self.table.redirects.taken(side))
    }

    /// Frames and bytes the program forwarded out of each side.
    pub(crate) fn forwarded(&self) -> [(u64, u64); 2] {
        [Side::Inside, Side::Outside].map(|side| self.table.map.forwarded(side as u32))
    }
}

/// Heads of a batch's frames kept before translation, each with whether
/// its transport checksum looks left partial by its sender's offload;
/// None for frames the offload has no interest in.
type Heads = Vec<Option<(Head, bool)>>;

/// A flow direction in the program's table.
struct Known {
    /// Without Ethernet addresses: those come from the next hop's.
    action: FlowAction,
    /// The Ethernet addresses installed with it.
    eth: [u8; 12],
    /// Where the flow's frames leave.
    to: Side,
    /// The head of its last frame the engine saw, and the side it came in on.
    head: Head,
    side: Side,
    /// The program's count of its frames at the last sweep.
    counted: u64,
    /// When the program was last seen to forward a frame of it.
    seen: u64,
}

/// Why a flow direction went back to the workers (metric
/// `natrix_offload_returned_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Returned {
    /// A frame of it reached the engine and was not translated the plain
    /// way (a FIN, a RST, a partial checksum), or the other direction's did.
    Frame,
    /// The engine no longer has its session steady.
    NotSteady,
    /// No frame of it for `IDLE_NS`.
    Idle,
    /// Its next hop's address is no longer known fresh, or its new one did
    /// not fit the table.
    NextHop,
    /// The interface it leaves by stopped taking redirected frames.
    Egress,
    /// Gone from the program's table.
    Gone,
    /// Its worker's sessions or rules changed all at once (a clear, a
    /// reload, a standby switch).
    Reset,
}

impl Returned {
    pub const ALL: [Returned; 7] = [Returned::Frame, Returned::NotSteady, Returned::Idle, Returned::NextHop, Returned::Egress, Returned::Gone, Returned::Reset];

    pub fn name(self) -> &'static str {
        match self {
            Returned::Frame => "frame",
            Returned::NotSteady => "not_steady",
            Returned::Idle => "idle",
            Returned::NextHop => "next_hop",
            Returned::Egress => "egress",
            Returned::Gone => "gone",
            Returned::Reset => "reset",
        }
    }
}

/// One worker's flow directions: counted towards learning, and in the
/// program's table.
pub(crate) struct Offloader {
    plan: OffloadPlan,
    recent: Recent,
    known: HashMap<FlowKey, Known>,
    /// Flow directions handed back, by why.
    returned: [u64; Returned::ALL.len()],
    /// Installs the table refused, being full, and until when none is tried.
    refused: u64,
    full_until: u64,
    next_sweep: u64,
    /// The flow directions the sweep under way has yet to go through, out
    /// of how many, since when.
    sweeping: Vec<FlowKey>,
    sweep_total: usize,
    sweep_start: u64,
    heads: Heads,
    /// The next hops' moves followed so far (`OffloadPlan::moves`).
    moves_followed: u64,
}

impl Offloader {
    pub(crate) fn new(plan: OffloadPlan) -> Offloader {
        Offloader {
            plan,
            recent: Recent::new(),
            known: HashMap::new(),
            returned: [0; Returned::ALL.len()],
            refused: 0,
            full_until: 0,
            next_sweep: 0,
            sweeping: Vec::new(),
            sweep_total: 0,
            sweep_start: 0,
            heads: Vec::new(),
            moves_followed: 0,
        }
    }

    /// Flow directions in the program's table, and installs it refused.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.known.len() as u64, self.refused)
    }

    /// Flow directions handed back to the workers, by `Returned::ALL`.
    pub(crate) fn returned(&self) -> [u64; Returned::ALL.len()] {
        self.returned
    }

    /// Keeps the heads of a batch's frames before the engine translates
    /// them, each with whether it came with a checksum left partial
    /// (`looked_partial[i]`, as the worker found before finishing it).
    pub(crate) fn before_batch<F: FrameBuf>(&mut self, frames: &mut [F], looked_partial: &[bool]) {
        self.heads.clear();
        self.heads.extend(frames.iter_mut().zip(looked_partial).map(|(f, &partial)| offload::head(f.frame()).map(|head| (head, partial))));
    }

    /// Learns from, or forgets, the flows of the batch `before_batch` saw,
    /// now that the engine has translated it: `sides[i]` the side frame i
    /// arrived on, `verdicts[i]` what became of it.
    pub(crate) fn after_batch<F: FrameBuf>(&mut self, engine: &Engine, sides: &[Side], frames: &mut [F], verdicts: &[Verdict], now: u64) {
        let heads = std::mem::take(&mut self.heads);
        for (i, head) in heads.iter().enumerate() {
            if let Some((before, partial)) = head {
                self.observe(engine, sides[i], (before, *partial), verdicts[i], frames[i].frame(), now);
            }
        }
        self.heads = heads;
    }

    /// What the engine did with the frame whose head was `before`, arrived
    /// on `side`: `verdict`, leaving `after`. A flow direction in the table
    /// is forgotten on a frame not learnt from (a FIN), with the other
    /// direction of its flow: a FIN or RST ends both. A frame whose
    /// checksum looked partial is not learnt from, as the program hands
    /// such frames back (a flow learnt from one would sit in the table
    /// unused), but changes nothing for a flow in the table when it is
    /// otherwise plain: one whole frame in 65,535 looks partial, and a bulk
    /// transfer would lose its offload to it.
    fn observe(&mut self, engine: &Engine, side: Side, (before, partial): (&Head, bool), verdict: Verdict, after: &[u8], now: u64) {
        let ifindex = self.plan.table.ifindex[side as usize];
        let Some(key) = offload::flow_key(before, ifindex) else { return };
        let known = self.known.contains_key(&key);
        let learnt = match verdict {
            Verdict::Forward(to) if self.plan.table.redirects.taken(to) && (known || (!partial && self.ready_to_learn(&key, now))) => {
                let learnt = engine.may_offload(before, side).then(|| offload::learn(before, ifindex, after, self.plan.egress(to))).flatten();
                if learnt.is_none() {
                    // Counted again from 0: a flow the engine keeps is
                    // looked up once every `LEARN_AFTER` frames, not at each.
                    self.recent.reset(&key);
                }
                learnt.map(|(_, action)| (action, to))
            }
            _ => None,
        };
        match learnt {
            Some(_) if partial => {}
            Some((action, to)) => self.keep(key, action, to, (side, before), now),
            None if known => self.forget_flow(&key, Returned::Frame),
            None => {}
        }
    }

    /// Counts a frame of a flow direction not in the table; whether it is
    /// time to try learning it. Not while the table was lately full.
    fn ready_to_learn(&mut self, key: &FlowKey, now: u64) -> bool {
        self.recent.count(key) >= LEARN_AFTER && now >= self.full_until
    }

    /// A frame of the flow direction `key`, arrived on `side` as `head`,
    /// was translated as `action` says (less its Ethernet addresses) to
    /// leave on `to`: the program takes the flow over, or keeps it as it
    /// is unless its rewrite or its next hop changed.
    fn keep(&mut self, key: FlowKey, action: FlowAction, to: Side, (side, head): (Side, &Head), now: u64) {
        let Some(eth) = self.plan.ethernet_to(to, action.dst_addr(), now) else {
            // The next hop is not known fresh: the workers address the
            // frames (and ask for it) until it is.
            self.forget(&key, Returned::NextHop);
            return;
        };
        if let Some(k) = self.known.get_mut(&key) {
            (k.head, k.side) = (*head, side);
            if (k.action, k.eth, k.to) == (action, eth, to) {
                return;
            }
        }
        match self.plan.table.map.install(&key, &action.with_ethernet(eth)) {
            Ok(()) => {
                self.known.insert(key, Known { action, eth, to, head: *head, side, counted: 0, seen: now });
            }
            Err(_) => {
                // Full: no install is tried for a while, rather than a
                // failing system call for every frame of every flow.
                self.refused += 1;
                self.full_until = now + SWEEP_NS;
                self.forget(&key, Returned::Gone);
            }
        }
    }

    fn forget(&mut self, key: &FlowKey, why: Returned) {
        if self.known.remove(key).is_some() {
            self.plan.table.map.remove(key);
            self.returned[why as usize] += 1;
        }
    }

    /// Forgets the flow direction `key` and the other direction of its flow.
    fn forget_flow(&mut self, key: &FlowKey, why: Returned) {
        if let Some(k) = self.known.remove(key) {
            self.plan.table.map.remove(key);
            self.returned[why as usize] += 1;
            self.forget(&key.reverse(&k.action), why);
        }
    }

    /// Hands every flow direction of this worker back to the engine: its
    /// sessions or rules changed all at once (a subscriber cleared, a
    /// reload, a standby switch).
    pub(crate) fn forget_all(&mut self) {
        for (key, _) in self.known.drain() {
            self.plan.table.map.remove(&key);
            self.returned[Returned::Reset as usize] += 1;
        }
        self.sweeping.clear();
    }

    /// Goes through the flow directions, at most once a second and
    /// `SWEEP_SLICE` of them per call: refreshes the sessions of those the
    /// program forwarded frames of since the last time; hands back to the
    /// engine those it no longer has steady, those idle, those whose next
    /// hop is no longer known and those whose interface no longer takes
    /// redirected frames; follows a next hop's new address.
    pub(crate) fn sweep(&mut self, engine: &mut Engine, now: u64) {
        self.follow_moved_next_hops(now);
        if self.sweeping.is_empty() {
            if now < self.next_sweep {
                return;
            }
            self.plan.table.redirects.read_again(now);
            self.next_sweep = now + SWEEP_NS;
            self.sweeping.extend(self.known.keys());
            (self.sweep_total, self.sweep_start) = (self.sweeping.len(), now);
        }
        let from = self.sweeping.len().saturating_sub(self.sweep_slice(now));
        let Offloader { plan, known, sweeping, returned, .. } = self;
        for key in sweeping.drain(from..) {
            let Some(k) = known.get_mut(&key) else { continue };
            if let Some(why) = sweep_one(plan, engine, &key, k, now) {
                plan.table.map.remove(&key);
                known.remove(&key);
                returned[why as usize] += 1;
            }
        }
    }
}

impl Offloader {
    /// Once a next hop has moved to another link-layer address (a router
    /// failover's gratuitous ARP), the flow directions addressed to its old
    /// one are addressed to its new one, at once rather than at the next
    /// sweep: the program would send their frames to the old one until
    /// then. An offloader that fell behind the moves kept looks up every
    /// flow direction's next hop.
    fn follow_moved_next_hops(&mut self, now: u64) {
        let count = self.plan.moves.count();
        if count == self.moves_followed {
            return;
        }
        let since = self.plan.moves.since(self.moves_followed, count);
        self.moves_followed = count;
        let Offloader { plan, known, returned, .. } = self;
        known.retain(|key, k| {
            let kept = match &since {
                Since::Moves(moves) => moves.iter().all(|m| k.to != m.side || k.eth[..6] != m.old || readdress(plan, key, k, m.new)),
                Since::TooMany => follow_next_hop(plan, key, k, now),
            };
            if !kept {
                plan.table.map.remove(key);
                returned[Returned::NextHop as usize] += 1;
            }
            kept
        });
    }

    /// How many flow directions this round of the sweep goes through: at
    /// least `SWEEP_SLICE`, and as many as keep it on course to end
    /// `SWEEP_NS` after it started.
    fn sweep_slice(&self, now: u64) -> usize {
        slice_due(self.sweep_total, self.sweeping.len(), now.saturating_sub(self.sweep_start))
    }
}

/// One flow direction at a sweep: its session refreshed where the program
/// forwarded frames of it since the last, its next hop followed; why it
/// goes back to the workers, if it does.
fn sweep_one(plan: &OffloadPlan, engine: &mut Engine, key: &FlowKey, k: &mut Known, now: u64) -> Option<Returned> {
    let steady = match plan.table.map.frames(key) {
        Some(frames) if frames != k.counted => {
            (k.counted, k.seen) = (frames, now);
            engine.refresh_offloaded(&k.head, k.side)
        }
        Some(_) if now.saturating_sub(k.seen) >= IDLE_NS => return Some(Returned::Idle),
        Some(_) => engine.may_offload(&k.head, k.side),
        None => return Some(Returned::Gone),
    };
    if !steady {
        Some(Returned::NotSteady)
    } else if !plan.table.redirects.taken(k.to) {
        Some(Returned::Egress)
    } else if !follow_next_hop(plan, key, k, now) {
        Some(Returned::NextHop)
    } else {
        None
    }
}

/// Of a sweep through `total` flow directions with `left` to go, `elapsed`
/// ns after it started: how many to go through now.
fn slice_due(total: usize, left: usize, elapsed: u64) -> usize {
    let due = (total as u128 * u128::from(elapsed.min(SWEEP_NS)) / u128::from(SWEEP_NS)) as usize;
    due.saturating_sub(total - left).max(SWEEP_SLICE)
}

/// Installs the flow direction again with its next hop at `mac`; whether
/// the table took it.
fn readdress(plan: &OffloadPlan, key: &FlowKey, k: &mut Known, mac: [u8; 6]) -> bool {
    let mut eth = k.eth;
    eth[..6].copy_from_slice(&mac);
    install_addressed(plan, key, k, eth)
}

/// Installs the flow direction again with Ethernet addresses `eth` (the
/// frame count starting over); whether the table took it.
fn install_addressed(plan: &OffloadPlan, key: &FlowKey, k: &mut Known, eth: [u8; 12]) -> bool {
    let taken = plan.table.map.install(key, &k.action.with_ethernet(eth)).is_ok();
    if taken {
        (k.eth, k.counted) = (eth, 0);
    }
    taken
}

/// Whether a flow direction's next hop is still known; installed again
/// where its address changed.
fn follow_next_hop(plan: &OffloadPlan, key: &FlowKey, k: &mut Known, now: u64) -> bool {
    match plan.ethernet_to(k.to, k.action.dst_addr(), now) {
        Some(eth) => eth == k.eth || install_addressed(plan, key, k, eth),
        None => false,
    }
}

/// How many frames of each recent flow direction the engine forwarded, in
/// a small table of counters indexed by a seeded hash of the
/// key: a collision restarts a count, which only delays learning.
struct Recent {
    slots: Vec<u32>,
    seed: RandomState,
}

impl Recent {
    fn new() -> Recent {
        Recent { slots: vec![0; RECENT_SLOTS], seed: RandomState::new() }
    }

    /// Counts a frame of `key`'s flow direction; returns its count so far.
    fn count(&mut self, key: &FlowKey) -> u8 {
        let (slot, tag) = self.slot(key);
        let count = if *slot & !0xff == tag { (*slot & 0xff).saturating_add(1).min(0xff) } else { 1 };
        *slot = tag | count;
        count as u8
    }

    fn reset(&mut self, key: &FlowKey) {
        let (slot, tag) = self.slot(key);
        *slot = tag;
    }

    /// `key`'s slot, and the tag that tells it from other keys there: the
    /// hash's high 24 bits (the slot's low 8 are the count).
    fn slot(&mut self, key: &FlowKey) -> (&mut u32, u32) {
        let hash = self.seed.hash_one(key);
        (&mut self.slots[hash as usize % RECENT_SLOTS], (hash >> 32) as u32 & !0xff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(port: u8) -> FlowKey {
        let mut frame = [0u8; 54];
        frame[12..14].copy_from_slice(&[0x08, 0x00]);
        frame[14] = 0x45;
        frame[23] = 17;
        frame[35] = port;
        offload::flow_key(&frame, 1).expect("a UDP frame")
    }

    static VETH_TAKES: AtomicBool = AtomicBool::new(true);
    static READS: AtomicU64 = AtomicU64::new(0);

    fn read_veth(_: u32) -> io::Result<bool> {
        READS.fetch_add(1, Relaxed);
        Ok(VETH_TAKES.load(Relaxed))
    }

    #[test]
    fn redirects_are_read_again_once_a_second_and_a_failed_read_changes_nothing() {
        let r = Redirects::new([1, 2], [true, false], read_veth);
        assert!(r.taken(Side::Inside) && !r.taken(Side::Outside));
        VETH_TAKES.store(false, Relaxed);
        r.read_again(SWEEP_NS);
        assert!(!r.taken(Side::Inside) && !r.taken(Side::Outside));
        let reads = READS.load(Relaxed);
        // Within the second, no other worker reads again.
        VETH_TAKES.store(true, Relaxed);
        r.read_again(SWEEP_NS + SWEEP_NS / 2);
        assert_eq!(READS.load(Relaxed), reads);
        assert!(!r.taken(Side::Inside));
        r.read_again(2 * SWEEP_NS);
        assert!(r.taken(Side::Inside) && r.taken(Side::Outside));

        let failing = Redirects::new([1, 2], [true, false], |_| Err(io::Error::other("netlink")));
        failing.read_again(SWEEP_NS);
        assert!(failing.taken(Side::Inside) && !failing.taken(Side::Outside));
    }

    #[test]
    fn a_sweep_keeps_pace_with_the_second_however_seldom_it_is_called() {
        // A busy worker, called often: the least slice each time.
        assert_eq!(slice_due(100_000, 100_000, 1_000), SWEEP_SLICE);
        // An idle one, woken every 100 ms: a tenth of the flows each time.
        assert_eq!(slice_due(100_000, 100_000, SWEEP_NS / 10), 10_000);
        assert_eq!(slice_due(100_000, 90_000, SWEEP_NS / 5), 10_000);
        // Late: everything left.
        assert_eq!(slice_due(100_000, 30_000, 3 * SWEEP_NS), 30_000);
    }

    #[test]
    fn a_flow_is_counted_to_learning_and_counts_again_after_a_reset() {
        let mut recent = Recent::new();
        let counts: Vec<u8> = (0..LEARN_AFTER).map(|_| recent.count(&key(1))).collect();
        assert_eq!(counts, (1..=LEARN_AFTER).collect::<Vec<_>>());
        recent.reset(&key(1));
        assert_eq!(recent.count(&key(1)), 1);
    }

    #[test]
    fn counts_stay_apart_and_stop_at_their_ceiling() {
        let mut recent = Recent::new();
        for _ in 0..300 {
            recent.count(&key(1));
        }
        assert_eq!(recent.count(&key(1)), 0xff);
        let slot_of = |r: &Recent, k: &FlowKey| r.seed.hash_one(k) as usize % RECENT_SLOTS;
        let other = (2..=u8::MAX).map(key).find(|k| slot_of(&recent, k) != slot_of(&recent, &key(1))).expect("a key in another slot");
        assert_eq!(recent.count(&other), 1);
        assert_eq!(recent.count(&key(1)), 0xff);
    }
}
