//! Established flows forwarded by the XDP program itself, as netfilter's
//! flowtable forwards them past the stack: a frame of a flow in the table
//! is rewritten where the driver put it and redirected to its egress
//! interface, never copied into the UMEM, never seen by a worker.
//!
//! The worker decides what the table holds (`learn`): after the engine has
//! translated a frame of an established flow with the plain rewrite
//! (addresses, ports, TTL, checksums), the frame before and after give the
//! rewrite every later frame of the flow gets, with the two checksum
//! adjustments worked out once; the next hop's Ethernet address comes from
//! the worker's neighbour table. The program counts each flow's frames, so
//! that the worker can keep the engine's session alive while the flow is
//! busy (`Offload::frames`), and passes on every frame it does not take
//! itself: SYN, FIN and RST segments, fragments, IP options, a TTL about
//! to run out, a datagram past the egress MTU, a bad header checksum, a
//! transport checksum its sender's offload left partial.
//! Those reach the engine as before, on the slower path: a later frame of
//! the flow the program forwards may arrive first.
//!
//! The flow table maps a key to a slot of an array that holds the action
//! and the key again. A slot a flow gave up rests 100 ms before another
//! flow gets it, and the program checks the slot's key against the
//! frame's: the kernel may hand a deleted table entry to the next
//! insertion at once (Linux 6.1's BPF memory allocator), so a program
//! that found a flow's entry just before a worker removed it and
//! installed another could otherwise read the other flow's action and
//! send the frame where that flow's go.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::bpf::{self, Alu, Asm, Cond, Size};

// Where the fields the program reads lie in an untagged IPv4 frame.
const ETHERTYPE: i16 = 12;
const IP: i16 = 14;
const TOTAL_LEN: i16 = IP + 2;
const FRAGMENT: i16 = IP + 6;
const TTL: i16 = IP + 8;
const PROTOCOL: i16 = IP + 9;
const IP_CHECKSUM: i16 = IP + 10;
const SRC: i16 = IP + 12;
const DST: i16 = IP + 16;
const L4: i16 = IP + 20;
const UDP_LEN: i16 = L4 + 4;
const UDP_CHECKSUM: i16 = L4 + 6;
const TCP_OFFSET: i16 = L4 + 12;
const TCP_FLAGS: i16 = L4 + 13;
const TCP_CHECKSUM: i16 = L4 + 16;
/// Every frame the program takes holds a whole TCP header's room.
const HEAD: usize = L4 as usize + 20;

const TCP: u8 = 6;
const UDP: u8 = 17;
const FIN_SYN_RST: u8 = 0x07;

/// A flow's key in the table: the frame's addresses, ports and protocol as
/// they arrive, and the interface they arrive on.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    src: [u8; 4],
    dst: [u8; 4],
    ports: [u8; 4],
    proto: u32,
    ifindex: u32,
}

impl FlowKey {
    /// The key the other direction of the flow arrives with, once a frame
    /// of `self` left as `action` translated it: the new addresses and
    /// ports the other way round, on the interface it left by.
    pub fn reverse(&self, action: &FlowAction) -> FlowKey {
        let p = action.ports;
        FlowKey { src: action.dst, dst: action.src, ports: [p[2], p[3], p[0], p[1]], proto: self.proto, ifindex: action.egress }
    }
}

/// What the program does to a flow's frame.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowAction {
    /// The Ethernet address a frame of the flow must arrive for (natrix's
    /// own): others, flooded to natrix by a switch, are not forwarded.
    to_mac: [u8; 6],
    _pad0: u16,
    /// Destination and source Ethernet addresses, as the frame carries them.
    eth: [u8; 12],
    /// The longest IPv4 datagram the egress takes; longer ones go to the engine.
    max_len: u16,
    _pad: u16,
    src: [u8; 4],
    dst: [u8; 4],
    ports: [u8; 4],
    /// One's complement sums of the new header words less the old, in the
    /// checksum fields' byte order, for the IP and the TCP or UDP checksum.
    ip_delta: [u8; 2],
    l4_delta: [u8; 2],
    egress: u32,
    /// Which of the program's counters the flow's frames count in.
    counter: u32,
    /// Frames the program forwarded; the program's to write.
    frames: u64,
}

impl FlowAction {
    /// The destination address the frames get.
    pub fn dst_addr(&self) -> u32 {
        u32::from_be_bytes(self.dst)
    }

    /// The action with the Ethernet addresses (destination, source) the
    /// frames get.
    pub fn with_ethernet(self, eth: [u8; 12]) -> FlowAction {
        FlowAction { eth, ..self }
    }
}

// The offsets the program reads the action at.
const A_TO_MAC: i16 = 0;
const A_ETH: i16 = 8;
const A_MAX_LEN: i16 = 20;
const A_SRC: i16 = 24;
const A_DST: i16 = 28;
const A_PORTS: i16 = 32;
const A_IP_DELTA: i16 = 36;
const A_L4_DELTA: i16 = 38;
const A_EGRESS: i16 = 40;
const A_COUNTER: i16 = 44;
const A_FRAMES: i16 = 48;
const A_KEY: i16 = 56;
// A slot's size is also its stride in the mapped array: the kernel lays an
// array's values out rounded up to 8 bytes.
const _: () = assert!(size_of::<FlowAction>() == 56 && size_of::<FlowKey>() == 20 && size_of::<Slot>() == 80 && size_of::<Slot>().is_multiple_of(8));

/// An array slot: a flow's action, and the key of the flow it is for.
#[repr(C)]
#[derive(Clone, Copy)]
struct Slot {
    action: FlowAction,
    key: FlowKey,
    _pad: u32,
}

/// How long a slot a flow gave up rests before another flow gets it:
/// some 10^5 times what a program takes over a frame, and short enough
/// that twice the table's slots last a churn of a table's worth of flows
/// every 100 ms.
const SLOT_REST: Duration = Duration::from_millis(100);

/// Frames and bytes the program forwarded, per CPU.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Forwarded {
    frames: u64,
    bytes: u64,
}

/// How many counters the program keeps (`Egress::counter`).
pub const COUNTERS: u32 = 2;

/// Where a flow's frames leave: the interface, and the counter they count in.
#[derive(Debug, Clone, Copy)]
pub struct Egress {
    pub ifindex: u32,
    /// Below `COUNTERS`.
    pub counter: u32,
    /// The longest IPv4 datagram it takes; longer ones go to the engine.
    pub max_len: u16,
}

/// The flow table and the program's counters, shared by every interface's
/// program and every worker.
pub struct Offload {
    /// Flow key to slot index.
    flows: OwnedFd,
    /// Slot index to `Slot`.
    slots: OwnedFd,
    /// The slots in natrix's memory: a slot is written, and its count
    /// read, without a system call (a sweep reads every flow's count
    /// once a second, and a busy CGN has a table's worth of flows).
    slot_view: bpf::ArrayView,
    forwarded: OwnedFd,
    /// The slots, in shards by key, each over its own range: workers
    /// installing and removing flows at once mostly take different locks.
    slot_tables: Box<[Mutex<SlotTable>]>,
}

/// Which slot each flow of a shard has, and which of its slots are free or resting.
struct SlotTable {
    by_key: HashMap<FlowKey, u32>,
    free: Vec<u32>,
    /// Slots given up, oldest first, with when.
    resting: VecDeque<(Instant, u32)>,
    rest: Duration,
}

impl SlotTable {
    fn new(slots: std::ops::Range<u32>, rest: Duration) -> SlotTable {
        SlotTable { by_key: HashMap::new(), free: slots.rev().collect(), resting: VecDeque::new(), rest }
    }

    /// A slot no flow has had for `rest`; None when every one is in use or resting.
    fn take(&mut self, now: Instant) -> Option<u32> {
        while let Some(&(since, slot)) = self.resting.front() {
            if now.duration_since(since) < self.rest {
                break;
            }
            self.resting.pop_front();
            self.free.push(slot);
        }
        self.free.pop()
    }

    fn give_up(&mut self, slot: u32) {
        self.resting.push_back((Instant::now(), slot));
    }
}

/// At most this many shards of slots, each of at least `SLOTS_PER_SHARD`.
const SHARDS: u32 = 16;
const SLOTS_PER_SHARD: u32 = 1024;

impl Offload {
    /// A table of up to `capacity` flow directions.
    pub fn new(capacity: u32) -> io::Result<Offload> {
        Self::with_rest(capacity, SLOT_REST)
    }

    /// A table whose given-up slots rest `rest` before they are used again.
    fn with_rest(capacity: u32, rest: Duration) -> io::Result<Offload> {
        // Not preallocated, so the table's memory follows the flows in it;
        // the slots (an array, so allocated up front) twice its size, so
        // that a flow's slot can rest while a new flow takes another.
        let flows = bpf::map_create(bpf::BPF_MAP_TYPE_HASH, size_of::<FlowKey>(), size_of::<u32>(), capacity, bpf::BPF_F_NO_PREALLOC)?;
        let slot_count = capacity.saturating_mul(2);
        let slots = bpf::map_create(bpf::BPF_MAP_TYPE_ARRAY, size_of::<u32>(), size_of::<Slot>(), slot_count, bpf::BPF_F_MMAPABLE)?;
        let slot_view = bpf::ArrayView::map(&slots, slot_count as usize * size_of::<Slot>())?;
        let forwarded = bpf::map_create(bpf::BPF_MAP_TYPE_PERCPU_ARRAY, size_of::<u32>(), size_of::<Forwarded>(), COUNTERS, 0)?;
        let shards = (slot_count / SLOTS_PER_SHARD).clamp(1, SHARDS);
        let per_shard = slot_count / shards;
        let slot_tables = (0..shards).map(|i| Mutex::new(SlotTable::new(i * per_shard..(i + 1) * per_shard, rest))).collect();
        Ok(Offload { flows, slots, slot_view, forwarded, slot_tables })
    }

    /// The shard of `key`'s slots, locked.
    fn slot_table(&self, key: &FlowKey) -> std::sync::MutexGuard<'_, SlotTable> {
        let word = |b: [u8; 4]| u64::from(u32::from_ne_bytes(b));
        let mixed = (word(key.src) << 32 | word(key.dst)) ^ (word(key.ports) << 16 | u64::from(key.ifindex));
        let shard = (mixed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % self.slot_tables.len();
        self.slot_tables[shard].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts a flow direction in the table, or changes its action (its
    /// frame count starting again from 0), in a fresh slot either way:
    /// one a program may still be reading is never written. Fails (E2BIG)
    /// where the table is full, or every slot of the key's shard is in use
    /// or resting.
    pub fn install(&self, key: &FlowKey, action: &FlowAction) -> io::Result<()> {
        let mut table = self.slot_table(key);
        let slot = table.take(Instant::now()).ok_or_else(|| io::Error::from_raw_os_error(libc::E2BIG))?;
        self.write_slot(slot, &Slot { action: FlowAction { frames: 0, ..*action }, key: *key, _pad: 0 });
        // The system call publishes the entry (the kernel's insertion is a
        // release store), so a program that finds it finds the slot written;
        // the fence keeps the compiler from moving the write past the call.
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        if let Err(e) = bpf::map_update(&self.flows, key, &slot) {
            table.free.push(slot);
            return Err(e);
        }
        if let Some(old) = table.by_key.insert(*key, slot) {
            table.give_up(old);
        }
        Ok(())
    }

    /// The frames the program has forwarded of a flow direction in the
    /// table since it was installed; None where it is not there.
    pub fn frames(&self, key: &FlowKey) -> Option<u64> {
        let table = self.slot_table(key);
        let slot = *table.by_key.get(key)?;
        Some(self.slot_frames(slot))
    }

    /// Writes slot `index`, one no program reads: fresh or rested, and
    /// no table entry leads to it yet.
    fn write_slot(&self, index: u32, slot: &Slot) {
        let at = self.slot_view.at(index as usize * size_of::<Slot>(), size_of::<Slot>());
        // SAFETY: within the view (`at` checks), and aligned: the view
        // starts on a page and slots lie 80 bytes apart.
        unsafe { at.cast::<Slot>().write_volatile(*slot) };
    }

    /// The frames the program counted in slot `index`.
    fn slot_frames(&self, index: u32) -> u64 {
        let at = self.slot_view.at(index as usize * size_of::<Slot>() + A_FRAMES as usize, size_of::<u64>());
        // SAFETY: within the view and 8-byte aligned; the program writes
        // the count with one 8-byte store, so a read sees one whole value.
        unsafe { (*at.cast::<AtomicU64>()).load(Relaxed) }
    }

    /// Takes a flow direction out of the table; its next frame goes to the
    /// engine. One not there is no error.
    pub fn remove(&self, key: &FlowKey) {
        let mut table = self.slot_table(key);
        let _ = bpf::map_delete(&self.flows, key);
        if let Some(slot) = table.by_key.remove(key) {
            table.give_up(slot);
        }
    }

    /// Frames and bytes the program has forwarded that count in
    /// `counter`, summed over the CPUs.
    pub fn forwarded(&self, counter: u32) -> (u64, u64) {
        let mut per_cpu = vec![Forwarded::default(); bpf::possible_cpus()];
        if bpf::map_lookup(&self.forwarded, &counter, per_cpu.as_mut_slice()).is_err() {
            return (0, 0);
        }
        per_cpu.iter().fold((0, 0), |(f, b), c| (f + c.frames, b + c.bytes))
    }

    /// The program's fast path, with r1 holding the context: a frame of a
    /// flow in the table is rewritten and redirected; every other frame
    /// falls through past it, with r1 the context again.
    pub(super) fn fast_path(&self, asm: &mut Asm) {
        let (slow, tcp, key, udp_sum, send) = (asm.label(), asm.label(), asm.label(), asm.label(), asm.label());
        // r6 context, r7 frame, r9 datagram length, r8 the flow's action.
        asm.alu_reg(Alu::Mov, 6, 1);
        asm.load(Size::W, 7, 6, bpf::XDP_MD_DATA);
        asm.load(Size::W, 2, 6, bpf::XDP_MD_DATA_END);
        asm.alu_reg(Alu::Mov, 3, 7);
        asm.alu(Alu::Add, 3, HEAD as i32);
        asm.jump_if_reg(Cond::Gt, 3, 2, slow);
        self.checks(asm, slow, tcp);
        // UDP: its length at least its header and within the datagram.
        asm.jump_if(Cond::Lt, 9, 28, slow);
        asm.load(Size::H, 5, 7, UDP_LEN);
        asm.be16(5);
        asm.alu(Alu::And, 5, 0xffff);
        asm.jump_if(Cond::Lt, 5, 8, slow);
        asm.goto(key);
        asm.place(tcp);
        // TCP: its header within the datagram, and none of SYN, FIN, RST.
        asm.jump_if(Cond::Lt, 9, 40, slow);
        asm.load(Size::B, 4, 7, TCP_FLAGS);
        asm.alu(Alu::And, 4, i32::from(FIN_SYN_RST));
        asm.jump_if(Cond::Ne, 4, 0, slow);
        asm.load(Size::B, 5, 7, TCP_OFFSET);
        asm.alu(Alu::Rsh, 5, 4);
        asm.alu(Alu::Lsh, 5, 2);
        asm.jump_if(Cond::Lt, 5, 20, slow);
        asm.place(key);
        // r5: the transport header's length; it must fit the datagram.
        asm.alu_reg(Alu::Mov, 0, 9);
        asm.alu(Alu::Sub, 0, 20);
        asm.jump_if_reg(Cond::Gt, 5, 0, slow);
        partial_checksum_to_workers(asm, slow);
        self.look_up(asm, slow);
        addressed_to_us(asm, slow);
        asm.load(Size::H, 5, 8, A_MAX_LEN);
        asm.jump_if_reg(Cond::Gt, 9, 5, slow);
        // Counted without an atomic add: a flow's frames arrive on one
        // queue, and a count short by a race still shows the flow busy.
        asm.load(Size::DW, 5, 8, A_FRAMES);
        asm.alu(Alu::Add, 5, 1);
        asm.store(Size::DW, 8, A_FRAMES, 5);
        self.count(asm);
        rewrite(asm, udp_sum, send);
        asm.place(send);
        asm.load(Size::W, 1, 8, A_EGRESS);
        asm.alu(Alu::Mov, 2, 0);
        asm.call(bpf::REDIRECT);
        asm.exit();
        asm.place(slow);
        asm.alu_reg(Alu::Mov, 1, 6);
    }

    /// The frame's checks up to its transport: untagged IPv4 without
    /// options or fragmentation, a TTL left to decrement, a right header
    /// checksum, a length within the frame (r9), TCP (to `tcp`) or UDP
    /// (falling through). r3 the protocol.
    fn checks(&self, asm: &mut Asm, slow: bpf::Label, tcp: bpf::Label) {
        asm.load(Size::H, 3, 7, ETHERTYPE);
        asm.jump_if(Cond::Ne, 3, i32::from(u16::from_ne_bytes([0x08, 0x00])), slow);
        asm.load(Size::B, 3, 7, IP);
        asm.jump_if(Cond::Ne, 3, 0x45, slow);
        asm.load(Size::H, 3, 7, FRAGMENT);
        asm.alu(Alu::And, 3, i32::from(u16::from_ne_bytes([0x3f, 0xff])));
        asm.jump_if(Cond::Ne, 3, 0, slow);
        asm.load(Size::B, 3, 7, TTL);
        asm.jump_if(Cond::Le, 3, 1, slow);
        // RFC 1071: the 20 bytes summed as five words are a multiple of
        // 0xffff exactly when the checksum is right (the engine's test).
        asm.alu(Alu::Mov, 0, 0);
        for word in 0..5 {
            asm.load(Size::W, 4, 7, IP + 4 * word);
            asm.alu_reg(Alu::Add, 0, 4);
        }
        asm.alu(Alu::Mod, 0, 0xffff);
        asm.jump_if(Cond::Ne, 0, 0, slow);
        asm.load(Size::H, 9, 7, TOTAL_LEN);
        asm.be16(9);
        asm.alu(Alu::And, 9, 0xffff);
        asm.alu_reg(Alu::Mov, 3, 7);
        asm.alu_reg(Alu::Add, 3, 9);
        asm.alu(Alu::Add, 3, IP as i32);
        asm.jump_if_reg(Cond::Gt, 3, 2, slow);
        asm.load(Size::B, 3, 7, PROTOCOL);
        asm.jump_if(Cond::Eq, 3, i32::from(TCP), tcp);
        asm.jump_if(Cond::Ne, 3, i32::from(UDP), slow);
    }

    /// Builds the key on the stack from the frame (r3 the protocol) and
    /// looks it up: r8 the action, or to `slow` without one, or with a
    /// slot another flow holds (see the module's text).
    fn look_up(&self, asm: &mut Asm, slow: bpf::Label) {
        for (at, field) in [(-24, SRC), (-20, DST), (-16, L4)] {
            asm.load(Size::W, 5, 7, field);
            asm.store(Size::W, 10, at, 5);
        }
        asm.store(Size::W, 10, -12, 3);
        asm.load(Size::W, 5, 6, bpf::XDP_MD_INGRESS_IFINDEX);
        asm.store(Size::W, 10, -8, 5);
        map_lookup(asm, self.flows.as_raw_fd(), -24, slow);
        // The slot's index, read once: the entry's or, where the kernel
        // has just handed the entry to another flow, that flow's.
        asm.load(Size::W, 5, 0, 0);
        asm.store(Size::W, 10, -32, 5);
        map_lookup(asm, self.slots.as_raw_fd(), -32, slow);
        for word in 0..5 {
            asm.load(Size::W, 4, 0, A_KEY + 4 * word);
            asm.load(Size::W, 5, 10, -24 + 4 * word);
            asm.jump_if_reg(Cond::Ne, 4, 5, slow);
        }
        asm.alu_reg(Alu::Mov, 8, 0);
    }

    /// Adds the frame (r9 its datagram's length) to this CPU's counters.
    fn count(&self, asm: &mut Asm) {
        let done = asm.label();
        asm.load(Size::W, 5, 8, A_COUNTER);
        asm.store(Size::W, 10, -28, 5);
        map_lookup(asm, self.forwarded.as_raw_fd(), -28, done);
        asm.load(Size::DW, 5, 0, 0);
        asm.alu(Alu::Add, 5, 1);
        asm.store(Size::DW, 0, 0, 5);
        asm.load(Size::DW, 5, 0, 8);
        asm.alu_reg(Alu::Add, 5, 9);
        asm.alu(Alu::Add, 5, IP as i32);
        asm.store(Size::DW, 0, 8, 5);
        asm.place(done);
    }
}

/// r0 the value `map` holds under the key on the stack at `key_at`; to
/// `missing` where it holds none.
fn map_lookup(asm: &mut Asm, map: std::os::fd::RawFd, key_at: i32, missing: bpf::Label) {
    asm.load_map(1, map);
    asm.alu_reg(Alu::Mov, 2, 10);
    asm.alu(Alu::Add, 2, key_at);
    asm.call(bpf::MAP_LOOKUP_ELEM);
    asm.jump_if(Cond::Eq, 0, 0, missing);
}

/// A transport checksum its sender's offload left partial (the field
/// holds exactly the pseudo-header's sum: a veth peer's frames) goes to
/// the workers, which finish it; the program could only carry it on
/// unfinished. r3 the protocol and r9 the datagram's length, both kept.
fn partial_checksum_to_workers(asm: &mut Asm, slow: bpf::Label) {
    let (udp, sum) = (asm.label(), asm.label());
    // The words as loaded, in the machine's order: whether a one's
    // complement sum is a multiple of 0xffff does not depend on it, as
    // long as every word is in the same order.
    asm.alu(Alu::Mov, 0, i32::from(u16::from_ne_bytes([0, TCP])));
    asm.jump_if(Cond::Eq, 3, i32::from(UDP), udp);
    asm.load(Size::H, 4, 7, TCP_CHECKSUM);
    asm.goto(sum);
    asm.place(udp);
    asm.alu(Alu::Mov, 0, i32::from(u16::from_ne_bytes([0, UDP])));
    asm.load(Size::H, 4, 7, UDP_CHECKSUM);
    asm.place(sum);
    // pseudo-header - field: the field's complement added.
    asm.alu(Alu::Xor, 4, 0xffff);
    asm.alu_reg(Alu::Add, 0, 4);
    for field in [SRC, DST] {
        asm.load(Size::W, 4, 7, field);
        asm.alu_reg(Alu::Add, 0, 4);
    }
    asm.alu_reg(Alu::Mov, 4, 9);
    asm.alu(Alu::Sub, 4, 20);
    asm.be16(4);
    asm.alu_reg(Alu::Add, 0, 4);
    asm.alu(Alu::Mod, 0, 0xffff);
    asm.jump_if(Cond::Eq, 0, 0, slow);
}

/// Whether the frame (r7) was sent to the Ethernet address the action
/// (r8) names; if not, to `slow`.
fn addressed_to_us(asm: &mut Asm, slow: bpf::Label) {
    for (at, size) in [(0, Size::W), (4, Size::H)] {
        asm.load(size, 4, 7, at);
        asm.load(size, 5, 8, A_TO_MAC + at);
        asm.jump_if_reg(Cond::Ne, 4, 5, slow);
    }
}

/// The rewrite, r7 the frame and r8 the action; ends at `send`.
fn rewrite(asm: &mut Asm, udp_sum: bpf::Label, send: bpf::Label) {
    for (to, from) in [(0, A_ETH), (4, A_ETH + 4), (8, A_ETH + 8), (SRC, A_SRC), (DST, A_DST), (L4, A_PORTS)] {
        asm.load(Size::W, 5, 8, from);
        asm.store(Size::W, 7, to, 5);
    }
    asm.load(Size::B, 5, 7, TTL);
    asm.alu(Alu::Sub, 5, 1);
    asm.store(Size::B, 7, TTL, 5);
    adjust_checksum(asm, IP_CHECKSUM, A_IP_DELTA);
    asm.load(Size::B, 3, 7, PROTOCOL);
    asm.jump_if(Cond::Eq, 3, i32::from(UDP), udp_sum);
    adjust_checksum(asm, TCP_CHECKSUM, A_L4_DELTA);
    asm.goto(send);
    asm.place(udp_sum);
    // A UDP checksum of 0 means none was sent (RFC 768): it stays 0, and a
    // computed 0 goes out as all ones.
    let computed_zero = asm.label();
    asm.load(Size::H, 5, 7, UDP_CHECKSUM);
    asm.jump_if(Cond::Eq, 5, 0, send);
    fold_in_delta(asm, A_L4_DELTA);
    asm.jump_if(Cond::Eq, 5, 0, computed_zero);
    asm.store(Size::H, 7, UDP_CHECKSUM, 5);
    asm.goto(send);
    asm.place(computed_zero);
    asm.store_imm(Size::H, 7, UDP_CHECKSUM, 0xffff);
}

/// RFC 1624 eqn. 3 with the precomputed delta: HC' = ~(~HC + delta).
fn adjust_checksum(asm: &mut Asm, field: i16, delta: i16) {
    asm.load(Size::H, 5, 7, field);
    fold_in_delta(asm, delta);
    asm.store(Size::H, 7, field, 5);
}

/// r5 = ~(~r5 + delta), one's complement, 16 bits.
fn fold_in_delta(asm: &mut Asm, delta: i16) {
    asm.alu(Alu::Xor, 5, 0xffff);
    asm.load(Size::H, 4, 8, delta);
    asm.alu_reg(Alu::Add, 5, 4);
    asm.alu_reg(Alu::Mov, 4, 5);
    asm.alu(Alu::Rsh, 4, 16);
    asm.alu(Alu::And, 5, 0xffff);
    asm.alu_reg(Alu::Add, 5, 4);
    asm.alu(Alu::Xor, 5, 0xffff);
}

/// Whether the driver of interface `ifindex` takes frames redirected to it
/// from XDP (ndo_xdp_xmit). A veth takes them only while its peer has
/// NAPI: an XDP program, or GRO on.
pub fn takes_redirects(ifindex: u32) -> io::Result<bool> {
    Ok(super::netlink::xdp_features(ifindex)? & super::netlink::NETDEV_XDP_ACT_NDO_XMIT != 0)
}

/// The key of the flow `frame` belongs to as it arrives on `ifindex`, where
/// it is an untagged IPv4 TCP or UDP frame without options, not a fragment.
pub fn flow_key(frame: &[u8], ifindex: u32) -> Option<FlowKey> {
    let h = frame.get(..HEAD)?;
    let proto = h[PROTOCOL as usize];
    let fragment = u16::from_be_bytes([h[FRAGMENT as usize], h[FRAGMENT as usize + 1]]) & 0x3fff != 0;
    if h[12..14] != [0x08, 0x00] || h[IP as usize] != 0x45 || fragment || !(proto == TCP || proto == UDP) {
        return None;
    }
    let at = |o: i16| o as usize;
    Some(FlowKey {
        src: h[at(SRC)..at(SRC) + 4].try_into().ok()?,
        dst: h[at(DST)..at(DST) + 4].try_into().ok()?,
        ports: h[at(L4)..at(L4) + 4].try_into().ok()?,
        proto: u32::from(proto),
        ifindex,
    })
}

/// The head of a frame, kept before the engine translates it so that
/// `learn` can compare it with the result.
pub type Head = [u8; HEAD];

/// The head of `frame`, if it is long enough to be offloaded.
pub fn head(frame: &[u8]) -> Option<Head> {
    frame.first_chunk::<HEAD>().copied()
}

/// The table entry that gives every later frame of `before`'s flow (the
/// head of a frame as it arrived on `ifindex`) what the engine gave it:
/// `after`, to leave through `egress`, but for the Ethernet addresses,
/// which are the next hop's when the frame leaves (`with_ethernet`), not
/// what `after` holds yet. None where the engine did more than the plain
/// rewrite, or the frame is not one the program takes.
pub fn learn(before: &Head, ifindex: u32, after: &[u8], egress: Egress) -> Option<(FlowKey, FlowAction)> {
    let key = flow_key(before, ifindex)?;
    let after = after.first_chunk::<HEAD>()?;
    let proto = before[PROTOCOL as usize];
    if proto == TCP && before[TCP_FLAGS as usize] & FIN_SYN_RST != 0 || !plain_rewrite(before, after, proto) {
        return None;
    }
    let r = |o: i16, n: usize| &after[o as usize..o as usize + n];
    let mut action = FlowAction {
        to_mac: before[..6].try_into().ok()?,
        max_len: egress.max_len,
        src: r(SRC, 4).try_into().ok()?,
        dst: r(DST, 4).try_into().ok()?,
        ports: r(L4, 4).try_into().ok()?,
        egress: egress.ifindex,
        counter: egress.counter,
        ..FlowAction::default()
    };
    let words = |h: &Head, from: i16, to: i16| -> Vec<u16> { (from..to).step_by(2).map(|o| u16::from_be_bytes([h[o as usize], h[o as usize + 1]])).collect() };
    let (old_ip, new_ip) = (words(before, TTL, TTL + 2).into_iter().chain(words(before, SRC, L4)), words(after, TTL, TTL + 2).into_iter().chain(words(after, SRC, L4)));
    action.ip_delta = delta(old_ip, new_ip).to_be_bytes();
    let (old_l4, new_l4) = (words(before, SRC, L4 + 4), words(after, SRC, L4 + 4));
    action.l4_delta = delta(old_l4.into_iter(), new_l4.into_iter()).to_be_bytes();
    Some((key, action))
}

/// Whether `after` differs from `before` only where the plain rewrite
/// writes: Ethernet addresses, TTL down by one, IP checksum, addresses,
/// ports, the transport checksum.
fn plain_rewrite(before: &Head, after: &Head, proto: u8) -> bool {
    let same = |from: i16, to: i16| before[from as usize..to as usize] == after[from as usize..to as usize];
    let checksum = if proto == TCP { TCP_CHECKSUM } else { UDP_CHECKSUM };
    same(ETHERTYPE, TTL) && after[TTL as usize] == before[TTL as usize].wrapping_sub(1) && same(PROTOCOL, IP_CHECKSUM) && same(L4 + 4, checksum) && same(checksum + 2, HEAD as i16)
}

/// The one's complement sum of `new` less `old` (RFC 1624): what the sum
/// over a header changes by when its words `old` become `new`.
fn delta(old: impl Iterator<Item = u16>, new: impl Iterator<Item = u16>) -> u16 {
    let sum: u32 = old.map(|w| u32::from(!w)).chain(new.map(u32::from)).sum();
    let mut s = sum;
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

#[cfg(test)]
mod tests;
