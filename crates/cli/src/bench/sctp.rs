//! `natrix bench --mode sctp`: SCTP associations through NAPT44 (seed 001).
//! For N associations (default 1 M; 64 per subscriber, each with its own
//! tags): a **setup** pass, each association's INIT going out and its
//! INIT-ACK coming back (the two packets that give the NAT its state, as in
//! seed 001 section 6.2's experiments), then an **established** pass of a
//! DATA chunk out and one back per association. Frames are 66 bytes
//! (Ethernet 14, IPv4 20, SCTP 12, a 20-byte INIT or INIT-ACK chunk, or a
//! DATA chunk with 4 bytes), built between timed batches; every frame is
//! checked afterwards: out from a pool address with its port and tag as
//! sent, back to its subscriber. SCTP takes the engine's full path; one
//! worker. Memory per association is set beside seed 001's model (its
//! equation 3, M = 8h + 60n + 12 sum g) with h = n buckets and no tracked
//! address (g = 0), its default.

use natrix_engine::rng::Rng;
use natrix_engine::{Engine, EngineConfig, Side, Verdict};
use natrix_wire::{checksum, get_u16_at, get_u32_at, ipv4, proto, set_u16_at};
use serde::Serialize;

use super::{percentile, release_free_heap, rss_bytes, time_batch, PassResult};
use crate::Failure;

const DEFAULT_ASSOCIATIONS: u64 = 1 << 20;
const BATCH: usize = 64;
const PER_SUBSCRIBER: u64 = 64;
const FRAME_LEN: usize = 66;
const L3: usize = 14;
const L4: usize = L3 + 20;
const CHUNK: usize = L4 + 12;
const SERVER_PORT: u16 = 36412;
const POOL_BASE: u32 = 0xc613_0000;
const POOL_SIZE: u32 = 64;
const SERVER_BASE: u32 = 0xc612_0000;
const SUBSCRIBER_BASE: u32 = 0x6440_0000;
/// Seed 001 section 6.6: bytes per association and per hash bucket.
const SEED_RECORD: f64 = 60.0;
const SEED_BUCKET: f64 = 8.0;

#[derive(Serialize)]
struct Line {
    mode: &'static str,
    associations: u64,
    pass: &'static str,
    ns_per_packet: f64,
    mpps: f64,
    associations_per_second: Option<f64>,
    table_bytes_per_association: f64,
    rss_bytes_per_association: f64,
    seed001_model_bytes_per_association: f64,
    batch_p50_ns: u64,
    batch_p99_ns: u64,
    packets: u64,
    errors: u64,
}

/// One association: its subscriber, port, server and tags.
#[derive(Clone, Copy)]
struct Assoc {
    sub: u32,
    port: u16,
    server: u32,
    int_tag: u32,
    rem_tag: u32,
}

fn assoc(i: u64) -> Assoc {
    let mut r = Rng::new(i);
    let tag = |v: u64| (v as u32) | 1;
    Assoc {
        sub: SUBSCRIBER_BASE + (i / PER_SUBSCRIBER) as u32,
        port: 1024 + (i % PER_SUBSCRIBER) as u16,
        server: SERVER_BASE + (r.next_u64() & 0xffff) as u32,
        int_tag: tag(r.next_u64()),
        rem_tag: tag(r.next_u64()),
    }
}

pub fn run(associations: Option<u64>, json: bool) -> Result<(), Failure> {
    let n = associations.unwrap_or(DEFAULT_ASSOCIATIONS).max(1);
    let lines = bench(n)?;
    if !json {
        println!("SCTP (seed 001): {n} associations, {PER_SUBSCRIBER} per subscriber, one worker; {FRAME_LEN}-byte frames");
        println!("{:>12} {:>8} {:>8} {:>14} {:>10} {:>10} {:>12}", "pass", "ns/pkt", "Mpps", "assoc/s", "B/assoc", "RSS/assoc", "seed model");
    }
    let mut errors = 0;
    for l in &lines {
        errors += l.errors;
        if json {
            println!("{}", serde_json::to_string(l).expect("serializable"));
        } else {
            let per_s = l.associations_per_second.map_or("-".to_owned(), |v| format!("{:.2}M", v / 1e6));
            println!(
                "{:>12} {:>8.1} {:>8.2} {:>14} {:>10.1} {:>10.1} {:>12.1}",
                l.pass, l.ns_per_packet, l.mpps, per_s, l.table_bytes_per_association, l.rss_bytes_per_association, l.seed001_model_bytes_per_association
            );
        }
    }
    if errors > 0 {
        return Err(Failure::Other(format!("{errors} SCTP packets did not round-trip correctly")));
    }
    Ok(())
}

fn config(n: u64) -> EngineConfig {
    let mut cfg = EngineConfig {
        pool: (POOL_BASE..POOL_BASE + POOL_SIZE).collect(),
        max_sessions: 1024,
        max_subscribers: u32::try_from(n.div_ceil(PER_SUBSCRIBER) + 16).unwrap_or(u32::MAX),
        event_capacity: 1024,
        ..EngineConfig::default()
    };
    cfg.sctp.max_associations = u32::try_from(n).unwrap_or(u32::MAX);
    cfg
}

fn bench(n: u64) -> Result<Vec<Line>, Failure> {
    release_free_heap();
    let rss_before = rss_bytes();
    let mut engine = Engine::new(config(n)).map_err(|e| Failure::Other(e.to_string()))?;
    let setup = run_pass(&mut engine, n, true);
    let table_bytes = engine.associations().memory_bytes() as f64;
    let rss = rss_bytes().saturating_sub(rss_before) as f64;
    let live = engine.associations().len() as f64;
    let established = run_pass(&mut engine, n, false);
    let nf = (n as f64).max(1.0);
    let model = SEED_BUCKET + SEED_RECORD;
    let line = |pass: &'static str, r: &PassResult, setups: bool| {
        let mut batches = r.batch_ns.clone();
        batches.sort_unstable();
        let mpps = r.packets as f64 / r.busy_ns.max(1) as f64 * 1e3;
        Line {
            mode: "sctp",
            associations: n,
            pass,
            ns_per_packet: 1e3 / mpps,
            mpps,
            associations_per_second: setups.then(|| n as f64 / (r.busy_ns.max(1) as f64 / 1e9)),
            table_bytes_per_association: table_bytes / live.max(1.0),
            rss_bytes_per_association: rss / nf,
            seed001_model_bytes_per_association: model,
            batch_p50_ns: percentile(&batches, 50),
            batch_p99_ns: percentile(&batches, 99),
            packets: r.packets,
            errors: r.errors,
        }
    };
    Ok(vec![line("setup", &setup, true), line("established", &established, false)])
}

/// One pass over every association: INIT out and INIT-ACK back (`setup`),
/// or DATA out and DATA back.
fn run_pass(engine: &mut Engine, n: u64, setup: bool) -> PassResult {
    let mut res = PassResult { batch_ns: Vec::with_capacity((n as usize / BATCH + 1) * 2), ..PassResult::default() };
    let mut out = vec![[0u8; FRAME_LEN]; BATCH];
    let mut back = vec![[0u8; FRAME_LEN]; BATCH];
    let mut verdicts = [Verdict::Held; BATCH];
    let now_ns = 1_000_000_000u64 + u64::from(!setup) * 1_000_000_000;
    let mut start = 0u64;
    while start < n {
        let k = (n - start).min(BATCH as u64) as usize;
        for (j, f) in out.iter_mut().enumerate().take(k) {
            let a = assoc(start + j as u64);
            let (tag, chunk) = if setup { (0, Chunk::Init(a.int_tag)) } else { (a.rem_tag, Chunk::Data) };
            build(f, a.sub, a.port, a.server, SERVER_PORT, tag, chunk);
        }
        time_batch(&mut res, || engine.process_batch(&mut out[..k], Side::Inside, now_ns, &mut verdicts[..k]));
        for j in 0..k {
            let a = assoc(start + j as u64);
            let f = &out[j];
            let sent_right = verdicts[j] == Verdict::Forward(Side::Outside) && get_u16_at(f, L4) == a.port && get_u32_at(f, L3 + 16) == a.server;
            res.errors += u64::from(!sent_right);
            let chunk = if setup { Chunk::InitAck(a.rem_tag) } else { Chunk::Data };
            build(&mut back[j], a.server, SERVER_PORT, get_u32_at(f, L3 + 12), a.port, a.int_tag, chunk);
        }
        time_batch(&mut res, || engine.process_batch(&mut back[..k], Side::Outside, now_ns, &mut verdicts[..k]));
        for j in 0..k {
            let a = assoc(start + j as u64);
            let ok = verdicts[j] == Verdict::Forward(Side::Inside) && get_u32_at(&back[j], L3 + 16) == a.sub && get_u16_at(&back[j], L4 + 2) == a.port;
            res.errors += u64::from(!ok);
        }
        engine.drain_events(|_| {});
        engine.drain_output(|_| {});
        res.packets += 2 * k as u64;
        start += k as u64;
    }
    res
}

enum Chunk {
    Init(u32),
    InitAck(u32),
    Data,
}

/// Writes a 66-byte Ethernet/IPv4/SCTP frame with one chunk. Its CRC32c
/// is left 0: the NAT neither checks nor recomputes it (seed 001).
fn build(f: &mut [u8; FRAME_LEN], src: u32, sport: u16, dst: u32, dport: u16, tag: u32, chunk: Chunk) {
    *f = [0; FRAME_LEN];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    ipv4::emit_header(&mut f[L3..L4], src, dst, proto::SCTP, (FRAME_LEN - L3) as u16, 64, 0);
    set_u16_at(f, L4, sport);
    set_u16_at(f, L4 + 2, dport);
    f[L4 + 4..L4 + 8].copy_from_slice(&tag.to_be_bytes());
    let (chunk_type, init_tag) = match chunk {
        Chunk::Init(t) => (1, t),
        Chunk::InitAck(t) => (2, t),
        Chunk::Data => (0, 0),
    };
    f[CHUNK] = chunk_type;
    set_u16_at(f, CHUNK + 2, 20);
    f[CHUNK + 4..CHUNK + 8].copy_from_slice(&init_tag.to_be_bytes());
    debug_assert!(checksum::checksum(&f[L3..L4]) == 0, "the IPv4 header checksum verifies");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_sctp_bench_round_trips_every_packet() {
        let lines = bench(4096).unwrap();
        assert_eq!(lines.len(), 2);
        for l in &lines {
            assert_eq!((l.errors, l.packets), (0, 8192), "pass {}", l.pass);
            assert!(l.table_bytes_per_association > 40.0, "at least the record: {}", l.table_bytes_per_association);
        }
        assert!(lines[0].associations_per_second.is_some_and(|r| r > 0.0));
    }
}
