//! `natrix bench --mode host-id`: what HOST_ID (seed 000) costs, on one
//! core. A SYN-heavy pass offers `--flows` first SYNs (Linux's 74-byte
//! SYN, each opening its NAPT44 session) to three engines: one without
//! `[host_id]`; one with `mode = "syn"` and no option enabled, which looks
//! at every SYN and inserts nothing (the function runs before and after
//! NAPT44's translation); and one that inserts HOST_ID_WING and
//! HOST_ID_BOUCADAIR (port then IPv4) into every SYN, which grows it by 16
//! bytes where it lies: each frame sits in a buffer with room after it, as
//! an I/O backend's buffers have. Insertion's own cost is the third less
//! the second. Then an established pass of the same flows' data segments
//! (ACKs), which HOST_ID in SYN mode must leave to NAPT44's fast path.
//! The three engines run side by side, batch by batch: each batch of SYNs
//! (then of segments) goes to each engine in turn, made afresh for each,
//! which of them first rotating from batch to batch, so whatever the host
//! does meanwhile falls on all alike and evicts their tables alike. Each of
//! `ROUNDS` rounds builds fresh engines, in a rotating order; insertion's
//! cost is the median of the rounds' differences between the inserting
//! and the looked-at engine, the other figures medians of the rounds.
//! Time is the thread's CPU time, so a shared host's preemptions do not
//! count. Every SYN is checked to leave with the 16 bytes (or without),
//! every data segment to be forwarded unchanged.

use natrix_engine::host_id::{HostIdConfig, Kinds, Mode, Origin, WingData};
use natrix_engine::{Engine, EngineConfig, Side, Verdict};
use serde::Serialize;

use super::buffers::Buffers;
use super::syn_accel::{first_syn, segment, SYN_LEN};
use crate::Failure;

const BATCH: usize = 64;
/// Odd, so that a median is one round's.
const ROUNDS: usize = 7;
const SETUPS: [Setup; 3] = [Setup::Without, Setup::LookedAt, Setup::Inserting];
/// The engines' clock: every flow is opened and used at the same moment.
const NOW: u64 = 1_000_000_000;
const DEFAULT_FLOWS: u64 = 1 << 20;
const POOL_BASE: u32 = 0xc613_0000;
const FLOWS_PER_SUBSCRIBER: u64 = 64;
/// WING (4) and BOUCADAIR (10) and 2 NOPs.
const GROWTH: usize = 16;
const L4: usize = 34;
/// Room after each frame in its buffer, more than any insertion needs.
const ROOM: usize = 64;

/// SYNs in buffers with room after them, as received frames lie.
type Frames = Buffers<{ SYN_LEN + ROOM }>;

/// Buffer `k`'s frame made a SYN-sized frame at its start, to be written.
fn syn(frames: &mut Frames, k: usize) -> &mut [u8; SYN_LEN] {
    frames.fresh(k, 0, SYN_LEN).try_into().expect("SYN_LEN bytes")
}

#[derive(Serialize)]
struct Line {
    mode: &'static str,
    flows: u64,
    rounds: usize,
    /// A first SYN through NAPT44: without `[host_id]`; with HOST_ID
    /// looking but inserting nothing; with WING and BOUCADAIR inserted.
    /// Medians of the rounds.
    ns_per_syn_without: f64,
    ns_per_syn_looked_at: f64,
    ns_per_syn_with: f64,
    /// What inserting costs a SYN: the median of the rounds' `with` less
    /// `looked_at` (each round's engines ran side by side), and each round's.
    added_ns_per_syn: f64,
    added_ns_per_round: Vec<f64>,
    /// An established data segment, without and with `[host_id]` (inserting, SYN mode).
    ns_per_established_without: f64,
    ns_per_established_with: f64,
    errors: u64,
}

/// The engines a round compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    Without,
    LookedAt,
    Inserting,
}

pub fn run(flows: Option<u64>, json: bool) -> Result<(), Failure> {
    let flows = flows.unwrap_or(DEFAULT_FLOWS).max(BATCH as u64);
    let (mut syn, mut est) = ([Vec::new(), Vec::new(), Vec::new()], [Vec::new(), Vec::new(), Vec::new()]);
    let mut added = Vec::with_capacity(ROUNDS);
    let mut errors = 0;
    for i in 0..ROUNDS {
        // Each round builds its engines in the next order, so whatever
        // building first favours (the heap, huge pages) falls on each in turn.
        let mut setups = SETUPS;
        setups.rotate_left(i % SETUPS.len());
        let mut this = [0.0; 3];
        for r in round(flows, &setups)? {
            let k = SETUPS.iter().position(|&s| s == r.setup).expect("a setup of SETUPS");
            this[k] = r.syn_ns;
            syn[k].push(r.syn_ns);
            est[k].push(r.established_ns);
            errors += r.errors;
        }
        added.push(this[2] - this[1]);
    }
    let [s0, s1, s2] = syn.map(median);
    let [e0, _, e2] = est.map(median);
    let added_ns_per_syn = median(added.clone());
    let line = Line {
        mode: "host-id",
        flows,
        rounds: ROUNDS,
        ns_per_syn_without: s0,
        ns_per_syn_looked_at: s1,
        ns_per_syn_with: s2,
        added_ns_per_syn,
        added_ns_per_round: added,
        ns_per_established_without: e0,
        ns_per_established_with: e2,
        errors,
    };
    if json {
        println!("{}", serde_json::to_string(&line).expect("serializable"));
    } else {
        println!("HOST_ID (seed 000): {flows} first SYNs (74 bytes, NAPT44) and their data segments, one core, three engines side by side, median of {ROUNDS} rounds");
        println!("{:>22} {:>12} {:>12} {:>12} {:>12}", "", "no host_id", "looked at", "inserting", "difference");
        println!("{:>22} {:>12.1} {:>12.1} {:>12.1} {:>+12.1}", "ns per first SYN", s0, s1, s2, added_ns_per_syn);
        println!("{:>22} {:>12.1} {:>12} {:>12.1} {:>+12.1}", "ns per established", e0, "", e2, e2 - e0);
        println!("(first SYN: inserting less looked at, median of the rounds' differences; established: inserting less no host_id)");
    }
    if errors > 0 {
        return Err(Failure::Other(format!("{errors} frames did not come out as expected")));
    }
    Ok(())
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The tables of these modes' engines: room for `flows` sessions of
/// subscribers holding 64 flows each, on a pool of 1,024 addresses.
pub(super) fn table_config(flows: u64) -> EngineConfig {
    EngineConfig {
        pool: (POOL_BASE..POOL_BASE + 1024).collect(),
        max_sessions: u32::try_from(flows).unwrap_or(u32::MAX),
        max_subscribers: u32::try_from(flows / FLOWS_PER_SUBSCRIBER + 16).unwrap_or(u32::MAX),
        max_ports_per_subscriber: 2 * FLOWS_PER_SUBSCRIBER as u32,
        event_capacity: 1024,
        ..EngineConfig::default()
    }
}

fn config(flows: u64, setup: Setup) -> EngineConfig {
    let inserting = setup == Setup::Inserting;
    EngineConfig {
        host_id: (setup != Setup::Without).then_some(HostIdConfig {
            mode: Mode::Syn,
            wing: inserting.then_some(WingData::Ipv4Low16),
            boucadair: inserting.then_some(Origin::PortIpv4),
            lifetime: 0,
            enabled: false,
            kinds: Kinds::DEFAULT,
            rules: Vec::new(),
        }),
        ..table_config(flows)
    }
}

struct Round {
    setup: Setup,
    syn_ns: f64,
    established_ns: f64,
    errors: u64,
}

/// An engine of a round with what it has been timed for so far.
struct Timed {
    setup: Setup,
    engine: Engine,
    syn_busy: u64,
    est_busy: u64,
    errors: u64,
}

/// A round of fresh engines, one per setup, run side by side: each SYN
/// batch, then each data segment batch, goes to every engine in turn,
/// the first of them rotating from batch to batch.
fn round(flows: u64, setups: &[Setup]) -> Result<Vec<Round>, Failure> {
    // Each round starts from a heap the one before gave back.
    super::release_free_heap();
    let mut timed = Vec::with_capacity(setups.len());
    for &setup in setups {
        let engine = Engine::new(config(flows, setup)).map_err(|e| Failure::Other(e.to_string()))?;
        timed.push(Timed { setup, engine, syn_busy: 0, est_busy: 0, errors: 0 });
    }
    let mut frames = Frames::new(BATCH);
    let batches = flows.div_ceil(BATCH as u64);
    for b in 0..batches {
        let (i, n) = (b * BATCH as u64, (flows - b * BATCH as u64).min(BATCH as u64) as usize);
        for k in 0..timed.len() {
            let t = &mut timed[(b as usize + k) % setups.len()];
            match t.setup {
                Setup::Without => syns_without(t, &mut frames, i, n),
                Setup::LookedAt => syns_looked_at(t, &mut frames, i, n),
                Setup::Inserting => syns_inserting(t, &mut frames, i, n),
            }
        }
    }
    for t in &mut timed {
        t.engine.drain_events(|_| {});
    }
    for b in 0..batches {
        let (i, n) = (b * BATCH as u64, (flows - b * BATCH as u64).min(BATCH as u64) as usize);
        for k in 0..timed.len() {
            let t = &mut timed[(b as usize + k) % setups.len()];
            established_batch(t, &mut frames, i, n);
        }
    }
    Ok(timed.into_iter().map(|t| Round { setup: t.setup, syn_ns: t.syn_busy as f64 / flows as f64, established_ns: t.est_busy as f64 / flows as f64, errors: t.errors }).collect())
}

// Each engine's SYNs under a symbol of their own, so that callgrind can
// count each engine's instructions (`--toggle-collect`) though their
// batches interleave; the black_box keeps the compiler from merging the
// identical bodies into one symbol.
macro_rules! syns_under_a_symbol_each {
    ($($name:ident = $k:expr),*) => {$(
        #[inline(never)]
        fn $name(t: &mut Timed, frames: &mut Frames, i: u64, n: usize) {
            syn_batch(t, frames, i, n);
            std::hint::black_box($k);
        }
    )*};
}
syns_under_a_symbol_each!(syns_without = 0, syns_looked_at = 1, syns_inserting = 2);

/// First SYNs `i..i + n` through `t`'s engine, timed; each must leave
/// grown by insertion (or not, without it): where it lay, or as a copy
/// through the output queue.
#[inline(always)]
fn syn_batch(t: &mut Timed, frames: &mut Frames, i: u64, n: usize) {
    let mut verdicts = [Verdict::Held; BATCH];
    (0..n).for_each(|k| first_syn(syn(frames, k), i + k as u64));
    let mut as_expected = 0;
    let Timed { engine, syn_busy, .. } = t;
    frames.lend(n, |lent| {
        let start = thread_cpu_ns();
        engine.process_batch(lent, Side::Inside, NOW, &mut verdicts[..n]);
        engine.drain_output(|o| as_expected += usize::from(o.side == Side::Outside && o.data.len() == SYN_LEN + GROWTH));
        *syn_busy += thread_cpu_ns() - start;
    });
    let len = if t.setup == Setup::Inserting { SYN_LEN + GROWTH } else { SYN_LEN };
    as_expected += (0..n).filter(|&k| verdicts[k] == Verdict::Forward(Side::Outside) && frames.frame(k).len() == len).count();
    t.errors += n.abs_diff(as_expected) as u64;
}

/// The data segments of flows `i..i + n` through `t`'s engine, timed;
/// each must be forwarded.
fn established_batch(t: &mut Timed, frames: &mut Frames, i: u64, n: usize) {
    let mut verdicts = [Verdict::Held; BATCH];
    for k in 0..n {
        let f = syn(frames, k);
        first_syn(f, i + k as u64);
        let (src, dst) = (natrix_wire::get_u32_at(f, 26), natrix_wire::get_u32_at(f, 30));
        let (sport, dport) = (natrix_wire::get_u16_at(f, L4), natrix_wire::get_u16_at(f, L4 + 2));
        let seq = natrix_wire::get_u32_at(f, L4 + 4).wrapping_add(1);
        segment(f, (src, sport), (dst, dport), seq, 1, 0x10);
    }
    let Timed { engine, est_busy, .. } = t;
    frames.lend(n, |lent| {
        let start = thread_cpu_ns();
        engine.process_batch(lent, Side::Inside, NOW, &mut verdicts[..n]);
        *est_busy += thread_cpu_ns() - start;
    });
    // HOST_ID in SYN mode leaves data segments as they are.
    t.errors += (0..n).filter(|&k| verdicts[k] != Verdict::Forward(Side::Outside) || frames.frame(k).len() != SYN_LEN).count() as u64;
}

/// The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID).
pub(super) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given; the clock id is a constant.
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_syn_grows_with_host_id_and_every_segment_is_forwarded() {
        // Not a whole number of batches: the last one is partial.
        let rounds = round(4096 + 37, &[Setup::Without, Setup::LookedAt, Setup::Inserting]).unwrap();
        assert_eq!(rounds.len(), 3);
        for r in rounds {
            assert_eq!(r.errors, 0, "{:?}", r.setup);
        }
    }
}
