//! Micro-benchmarks of the per-packet building blocks: incremental checksum
//! update, the workers' check for partial checksums, flow index hit,
//! miss and insert, and port allocation.
//! Run: cargo bench -p natrix-engine --bench micro

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use natrix_engine::config::PortSelection;
use natrix_engine::pool::Pool;
use natrix_engine::rng::Rng;
use natrix_engine::state::index::FlowIndex;
use natrix_engine::Proto;
use natrix_wire::checksum::Delta;
use natrix_wire::checksum::{fold, pseudo_header_sum};
use natrix_wire::partial_checksum::{complete_if_partial, Found};

const ENTRIES: u32 = 1 << 20;

fn hash_of(k: u32) -> u64 {
    let mut z = u64::from(k).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^ (z >> 31)
}

fn checksum_update(c: &mut Criterion) {
    c.bench_function("checksum/incremental address+port", |b| {
        let mut field = 0x1c46u16;
        let mut addr = 0x6440_000au32;
        b.iter(|| {
            let d = Delta::from_u32(addr, addr ^ 0x5555).plus(Delta::from_u16(40000, 1024));
            field = d.apply(black_box(field));
            addr = addr.wrapping_add(1);
            field
        })
    });
}

/// A 1514-byte TCP frame with its checksum whole.
fn full_tcp_frame() -> Vec<u8> {
    let mut frame = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([100, 64, 0, 2], [198, 51, 100, 11], 64)
        .tcp(40000, 443, 7, 1024)
        .ack(9)
        .write(&mut frame, &[0x5a; 1460])
        .unwrap();
    frame
}

/// What every frame costs in the workers (a whole checksum: the check alone), and
/// what a partial one costs (finished over 1480 bytes).
fn partial_checksum(c: &mut Criterion) {
    let mut whole = full_tcp_frame();
    c.bench_function("partial checksum/check, whole 1514-byte TCP frame", |b| b.iter(|| complete_if_partial(black_box(&mut whole))));
    // As an offload leaves it: the pseudo-header's sum alone.
    let partial = {
        let mut f = full_tcp_frame();
        let pseudo = pseudo_header_sum(u32::from_be_bytes([100, 64, 0, 2]), u32::from_be_bytes([198, 51, 100, 11]), 6, 1480);
        f[50..52].copy_from_slice(&fold(pseudo).to_be_bytes());
        f
    };
    c.bench_function("partial checksum/finish, 1514-byte TCP frame", |b| {
        b.iter_batched_ref(
            || partial.clone(),
            |f| {
                assert_eq!(complete_if_partial(black_box(f)), Found::Finished);
            },
            BatchSize::SmallInput,
        )
    });
}

fn filled_index() -> FlowIndex {
    let mut t = FlowIndex::with_capacity(ENTRIES as usize);
    for k in 0..ENTRIES {
        t.insert(hash_of(k), k).unwrap();
    }
    t
}

fn flow_index(c: &mut Criterion) {
    let t = filled_index();
    let mut k = 0u32;
    c.bench_function("flow index/hit (1M entries)", |b| {
        b.iter(|| {
            k = (k + 7919) % ENTRIES;
            t.find(hash_of(k), |id| id == k)
        })
    });
    c.bench_function("flow index/miss (1M entries)", |b| {
        b.iter(|| {
            k = k.wrapping_add(7919);
            t.find(hash_of(k | 0x8000_0000), |_| false)
        })
    });
    c.bench_function("flow index/insert+remove (1M entries)", |b| {
        let mut t = filled_index();
        let mut k = ENTRIES;
        b.iter(|| {
            k += 1;
            t.insert(hash_of(k), k).unwrap();
            t.remove(hash_of(k), k)
        })
    });
}

fn port_allocation(c: &mut Criterion) {
    c.bench_function("pool/alloc+release, half-full address", |b| {
        b.iter_batched_ref(
            || {
                let mut p = Pool::new(&[0xcb00_7101], (1024, 65535), 0, PortSelection::Preserve, true, 0);
                let mut rng = Rng::new(1);
                for port in (1024..=65535u16).filter(|p| p % 4 < 2) {
                    p.alloc_port(0, Proto::Udp, port, &mut rng).unwrap();
                }
                (p, rng, 1024u16)
            },
            |(p, rng, want)| {
                *want = want.wrapping_add(2).max(1024);
                let got = p.alloc_port(0, Proto::Udp, *want, rng).unwrap();
                let mut none = Vec::new();
                p.release(0, Proto::Udp, got, 0, true, &mut none);
            },
            BatchSize::LargeInput,
        )
    });
}

criterion_group!(benches, checksum_update, partial_checksum, flow_index, port_allocation);
criterion_main!(benches);
