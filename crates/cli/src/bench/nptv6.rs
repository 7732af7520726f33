//! `natrix bench --mode nptv6`: the engine translating IPv6 prefixes (RFC
//! 6296) on 64-byte frames: Ethernet 14, IPv6 40, UDP 8 and 2 bytes of
//! payload (the smallest IPv6/UDP frame is 62 bytes; 68 on the wire with
//! the FCS). NPTv6 keeps no state, so there is one kind of pass: each
//! host's frame goes out through the inside and its reply comes back
//! through the outside, over and over until every worker has handled
//! `MIN_PACKETS`. Frames are built between timed batches; every frame is
//! checked afterwards: the outbound one leaves with the outside prefix and
//! a UDP checksum that still verifies (NPTv6 never touches it), and the
//! reply reaches the host's own inside address.

use std::net::Ipv6Addr;
use std::sync::Barrier;

use natrix_engine::nptv6::Binding;
use natrix_engine::rng::Rng;
use natrix_engine::{Engine, EngineConfig, Side, Verdict};
use natrix_wire::{checksum, ethernet, ipv6};

use super::{percentile, time_batch, Line, PassResult};
use crate::Failure;

pub const DEFAULT_FLOWS: [u64; 3] = [1 << 10, 1 << 16, 1 << 20];
const BATCH: usize = 64;
pub const FRAME_LEN: usize = 64;
/// Each worker handles at least this many frames, so the small sizes are
/// timed over more than a few microseconds.
const MIN_PACKETS: u64 = 1 << 23;
const L3: usize = ethernet::HEADER_LEN;
const L4: usize = L3 + ipv6::HEADER_LEN;
const UDP_LEN: usize = FRAME_LEN - L4;
const SRC_AT: usize = L3 + 8;
const DST_AT: usize = L3 + 24;
/// RFC 6296 section 3.6's binding; the servers are in 2001:db8:ff00::/40.
const INSIDE: Ipv6Addr = Ipv6Addr::new(0xfd01, 0x0203, 0x0405, 0, 0, 0, 0, 0);
const OUTSIDE: Ipv6Addr = Ipv6Addr::new(0x2001, 0x0db8, 0x0001, 0, 0, 0, 0, 0);
const SERVERS: u128 = 0x2001_0db8_ff00_0000_0000_0000_0000_0000;
const PREFIX_LEN: u8 = 48;

/// One host: its inside address, a server and the ports between them.
#[derive(Clone, Copy)]
struct Host {
    addr: u128,
    server: u128,
    sport: u16,
    dport: u16,
}

/// Host `i` of a worker: a pseudorandom subnet (never 0xFFFF, which RFC
/// 6296 cannot map) and interface identifier under the inside prefix.
fn host(worker: u32, i: u64) -> Host {
    let mut rng = Rng::new(i ^ u64::from(worker) << 40);
    let (a, b) = (rng.next_u64(), rng.next_u64());
    let subnet = (a % 0xffff) as u128;
    Host {
        addr: u128::from(INSIDE) | subnet << 64 | u128::from(b),
        server: SERVERS | u128::from(a >> 16 & 0xff_ffff) << 64 | u128::from(b.rotate_left(17)),
        sport: 1024 + (a >> 40) as u16 % 64512,
        dport: 1 + (b >> 48) as u16 % 49151,
    }
}

fn worker_config() -> EngineConfig {
    EngineConfig { translate: false, nptv6: vec![Binding { inside: INSIDE, outside: OUTSIDE, prefix_len: PREFIX_LEN }], event_capacity: 1024, ..EngineConfig::default() }
}

/// Runs `workers` engines side by side over `flows` hosts in all.
pub fn bench_one(flows: u64, workers: u32) -> Result<Line, Failure> {
    if flows < u64::from(workers) {
        return Err(Failure::Other("--flows must be at least --workers".into()));
    }
    let barrier = Barrier::new(workers as usize);
    let sync = &barrier;
    let results: Vec<Result<PassResult, Failure>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers).map(|w| s.spawn(move || run_worker(w, super::share(flows, workers, w), sync))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Failure::Other("bench worker panicked".into())))).collect()
    });
    let parts: Vec<PassResult> = results.into_iter().collect::<Result<_, _>>()?;
    let mpps: f64 = parts.iter().map(|p| p.packets as f64 / p.busy_ns.max(1) as f64 * 1e3).sum();
    let mut batches: Vec<u32> = parts.iter().flat_map(|p| p.batch_ns.iter().copied()).collect();
    batches.sort_unstable();
    Ok(Line {
        mode: "nptv6",
        flows,
        workers,
        pass: "stateless",
        order: "created",
        ns_per_packet: 1e3 / mpps * f64::from(workers),
        mpps,
        new_mappings_per_second: None,
        bytes_per_session: 0.0,
        table_bytes_per_session: 0.0,
        batch_p50_ns: percentile(&batches, 50),
        batch_p99_ns: percentile(&batches, 99),
        packets: parts.iter().map(|p| p.packets).sum(),
        errors: parts.iter().map(|p| p.errors).sum(),
    })
}

/// One worker's run: passes over its hosts until it has handled
/// `MIN_PACKETS` frames. `sync` starts the workers' timed work together.
fn run_worker(worker: u32, hosts: u64, sync: &Barrier) -> Result<PassResult, Failure> {
    let engine = Engine::new(worker_config());
    sync.wait();
    let mut engine = engine.map_err(|e| Failure::Other(e.to_string()))?;
    let mut res = PassResult::default();
    let mut now_ns = 1_000_000_000u64;
    while res.packets < MIN_PACKETS {
        run_pass(&mut engine, worker, hosts, &mut res, &mut now_ns);
    }
    Ok(res)
}

fn run_pass(engine: &mut Engine, worker: u32, hosts: u64, res: &mut PassResult, now_ns: &mut u64) {
    let mut out = vec![[0u8; FRAME_LEN]; BATCH];
    let mut back = vec![[0u8; FRAME_LEN]; BATCH];
    let mut verdicts = [Verdict::Held; BATCH];
    let mut start = 0u64;
    while start < hosts {
        let n = (hosts - start).min(BATCH as u64) as usize;
        for (k, frame) in out.iter_mut().enumerate().take(n) {
            let h = host(worker, start + k as u64);
            build(frame, h.addr, h.sport, h.server, h.dport);
        }
        time_batch(res, || engine.process_batch(&mut out[..n], Side::Inside, *now_ns, &mut verdicts[..n]));
        let mut ok = [false; BATCH];
        for k in 0..n {
            let sent = host(worker, start + k as u64);
            ok[k] = verdicts[k] == Verdict::Forward(Side::Outside) && left_translated(&out[k], &sent);
            build(&mut back[k], address(&out[k], DST_AT), sent.dport, address(&out[k], SRC_AT), sent.sport);
        }
        time_batch(res, || engine.process_batch(&mut back[..n], Side::Outside, *now_ns, &mut verdicts[..n]));
        for k in 0..n {
            let sent = host(worker, start + k as u64);
            let home = verdicts[k] == Verdict::Forward(Side::Inside) && address(&back[k], DST_AT) == sent.addr && udp_checksum_ok(&back[k]);
            res.errors += u64::from(!(ok[k] && home));
        }
        res.packets += 2 * n as u64;
        start += n as u64;
        *now_ns += 1_000;
    }
}

/// The outbound frame after natrix: source under the outside prefix, the
/// host's interface identifier kept, and a UDP checksum that verifies.
fn left_translated(frame: &[u8; FRAME_LEN], sent: &Host) -> bool {
    let src = address(frame, SRC_AT);
    let low64 = u128::from(u64::MAX);
    src >> 80 == u128::from(OUTSIDE) >> 80 && src & low64 == sent.addr & low64 && udp_checksum_ok(frame)
}

fn address(frame: &[u8; FRAME_LEN], at: usize) -> u128 {
    u128::from_be_bytes(frame[at..at + 16].try_into().expect("16 bytes"))
}

fn udp_checksum_ok(frame: &[u8; FRAME_LEN]) -> bool {
    checksum::udp_v6_checksum_ok(Ipv6Addr::from(address(frame, SRC_AT)), Ipv6Addr::from(address(frame, DST_AT)), &frame[L4..])
}

/// Writes a 64-byte Ethernet/IPv6/UDP frame with a valid UDP checksum.
fn build(f: &mut [u8; FRAME_LEN], src: u128, sport: u16, dst: u128, dport: u16) {
    *f = [0; FRAME_LEN];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&ethernet::ETHERTYPE_IPV6.to_be_bytes());
    let (src, dst) = (Ipv6Addr::from(src), Ipv6Addr::from(dst));
    ipv6::emit_header(&mut f[L3..L4], src, dst, ipv6::next_header::UDP, UDP_LEN as u16, 64).expect("40 bytes");
    f[L4..L4 + 2].copy_from_slice(&sport.to_be_bytes());
    f[L4 + 2..L4 + 4].copy_from_slice(&dport.to_be_bytes());
    f[L4 + 4..L4 + 6].copy_from_slice(&(UDP_LEN as u16).to_be_bytes());
    f[L4 + 8..].copy_from_slice(b"n6");
    let c = checksum::udp_checksum_v6(src, dst, &f[L4..]);
    f[L4 + 6..L4 + 8].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_round_trips_every_frame_with_valid_checksums() {
        let line = bench_one(1000, 2).unwrap();
        assert_eq!(line.errors, 0);
        assert!(line.packets >= 2 * MIN_PACKETS);
        assert_eq!((line.mode, line.pass), ("nptv6", "stateless"));
    }

    #[test]
    fn hosts_are_unique_and_mappable() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000 {
            let h = host(0, i);
            assert_ne!(h.addr >> 64 & 0xffff, 0xffff);
            assert!(seen.insert(h.addr));
        }
    }
}
