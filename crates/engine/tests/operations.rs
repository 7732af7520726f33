//! What the live dataplane asks of the engine beyond translation: splitting
//! work across workers (shards), path MTU (RFC 1191), and operator actions
//! (listing, clearing a subscriber, reloading the configuration).

#![allow(clippy::too_many_arguments)]

mod common;

use common::*;
use natrix_engine::events::EventKind;
use natrix_engine::shard::{port_slice, worker_of_subscriber, Owners, Shard};
use natrix_engine::{DropReason, EngineConfig, Side, Verdict};

const REMOTE: [u8; 4] = [198, 51, 100, 7];

fn subscriber_of_worker(worker: u16, count: u16) -> [u8; 4] {
    (2..).map(|i| addr_of(u32_of([100, 64, 0, 0]) + i)).find(|&a| worker_of_subscriber(u32_of(a), count) == worker).unwrap()
}

fn sharded(index: u16, count: u16) -> EngineConfig {
    EngineConfig { shard: Shard { index, count }, ..config() }
}

fn send_out(e: &mut natrix_engine::Engine, sub: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, now: u64) -> (Verdict, Decoded) {
    let mut f = udp_frame(Side::Inside, sub, sport, dst, dport, 64, b"x", false);
    let v = run(e, &mut f, Side::Inside, now);
    (v, must_decode(&f))
}

#[test]
fn each_worker_allocates_only_from_its_port_slice() {
    for index in 0..3u16 {
        let mut e = engine(sharded(index, 3));
        let (lo, hi) = port_slice((1024, 65535), 0, Shard { index, count: 3 });
        let sub = subscriber_of_worker(index, 3);
        for sport in [80u16, 1030, 40000, 65000] {
            let (v, d) = send_out(&mut e, sub, sport, REMOTE, 53, SEC);
            assert_eq!(v, Verdict::Forward(Side::Outside));
            let p = d.udp().source_port;
            assert!((lo..=hi).contains(&p), "worker {index}: port {p} outside {lo}-{hi}");
        }
    }
}

#[test]
fn a_hairpin_to_another_workers_mapping_leaves_outside_for_the_dataplane_to_turn_around() {
    let count = 2;
    let (a, b) = (subscriber_of_worker(0, count), subscriber_of_worker(1, count));
    let mut w0 = engine(sharded(0, count));
    let mut w1 = engine(sharded(1, count));
    let (_, db) = send_out(&mut w1, b, 5000, REMOTE, 53, SEC);
    let (b_ext, b_port) = (db.src(), db.udp().source_port);
    let owners = Owners::new((1024, 65535), 0, count, &[]);
    assert_eq!(owners.of_external(natrix_engine::Proto::Udp, u32_of(b_ext), b_port), 1);
    // a (worker 0) sends to b's external endpoint: translated source, destination untouched.
    let (v, d) = send_out(&mut w0, a, 6000, b_ext, b_port, SEC);
    assert_eq!(v, Verdict::Forward(Side::Outside));
    assert!(in_pool(w0.config(), d.src()));
    assert_eq!((d.dst(), d.udp().destination_port), (b_ext, b_port));
    // Worker 1 takes it as inbound and delivers to b (RFC 4787 REQ-9: source is a's external endpoint).
    let mut f = udp_frame(Side::Outside, d.src(), d.udp().source_port, b_ext, b_port, 63, b"x", false);
    assert_eq!(run(&mut w1, &mut f, Side::Outside, SEC), Verdict::Forward(Side::Inside));
    let back = must_decode(&f);
    assert_eq!((back.dst(), back.udp().destination_port), (b, 5000));
    assert_eq!(back.src(), d.src());
}

/// RFC 5508 REQ-7 across workers: b (worker 1) answers a's hairpinned
/// datagram with an ICMP error; worker 1 sends it on outside for the
/// dataplane to turn around, and worker 0 delivers it to a.
#[test]
fn a_hairpinned_icmp_error_to_another_workers_subscriber_reaches_it() {
    let count = 2;
    let (a, b) = (subscriber_of_worker(0, count), subscriber_of_worker(1, count));
    let (mut w0, mut w1) = (engine(sharded(0, count)), engine(sharded(1, count)));
    let (_, db) = send_out(&mut w1, b, 5000, REMOTE, 53, SEC);
    let (b_ext, b_port) = (db.src(), db.udp().source_port);
    let (_, d) = send_out(&mut w0, a, 6000, b_ext, b_port, SEC);
    let (a_ext, a_port) = (d.src(), d.udp().source_port);
    let mut f = udp_frame(Side::Outside, a_ext, a_port, b_ext, b_port, 63, b"x", false);
    assert_eq!(run(&mut w1, &mut f, Side::Outside, SEC), Verdict::Forward(Side::Inside));
    // b's host: port unreachable, quoting what it got, to a's external address.
    let mut err = icmp_frame(Side::Inside, b, a_ext, 64, port_unreachable(), &quote_of(&f));
    assert_eq!(run(&mut w1, &mut err, Side::Inside, 2 * SEC), Verdict::Forward(Side::Outside), "to worker 0 by way of the dataplane");
    let out = must_decode(&err);
    assert_eq!((out.src(), out.dst()), (b_ext, a_ext));
    let owners = Owners::new((1024, 65535), 0, count, &[]);
    let q = must_quoted(&out);
    assert_eq!(owners.of_external(natrix_engine::Proto::Udp, u32_of(q.ip.source), q.sport()), 0, "the quoted source is worker 0's");
    let mut turned = err.clone();
    turned[0..12].copy_from_slice(&[macs(Side::Outside).1, macs(Side::Outside).0].concat());
    assert_eq!(run(&mut w0, &mut turned, Side::Outside, 2 * SEC), Verdict::Forward(Side::Inside));
    let d = must_decode(&turned);
    assert_eq!((d.src(), d.dst()), (b_ext, a), "delivered to a from b's external address");
    let q = must_quoted(&d);
    assert_eq!((q.ip.source, q.sport(), q.ip.destination, q.dport()), (a, 6000, b_ext, b_port));
}

fn set_dont_fragment(f: &mut [u8], on: bool) {
    let ip = ETH_LEN;
    if on {
        f[ip + 6] |= 0x40
    } else {
        f[ip + 6] &= !0x40
    }
    f[ip + 10..ip + 12].fill(0);
    let sum = !ones_complement_sum(&f[ip..ip + 20]);
    f[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
}

fn ones_complement_sum(b: &[u8]) -> u16 {
    let mut s: u32 = b.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

#[test]
fn a_datagram_too_big_for_the_egress_link_with_df_gets_fragmentation_needed() {
    let mut cfg = config();
    cfg.egress_mtu = [1500, 1400];
    let mut e = engine(cfg);
    let sub = [100, 64, 0, 9];
    let mut f = udp_frame(Side::Inside, sub, 4000, REMOTE, 53, 64, &[0u8; 1450], false);
    set_dont_fragment(&mut f, true);
    assert_eq!(run(&mut e, &mut f.clone(), Side::Inside, SEC), Verdict::Drop(DropReason::FragmentationNeeded));
    let out = outputs(&mut e);
    assert_eq!(out.len(), 1);
    let (side, _, icmp) = &out[0];
    assert_eq!(*side, Side::Inside);
    let d = must_decode(icmp);
    assert_eq!(d.dst(), sub);
    let bytes = d.icmp().to_bytes();
    assert_eq!((bytes[0], bytes[1]), (3, 4));
    assert_eq!(u16::from_be_bytes([bytes[6], bytes[7]]), 1400, "RFC 1191 next-hop MTU");
    // Without DF it leaves translated, as fragments that fit (RFC 4787
    // REQ-13): etherparse reads each, and their data put together is the
    // translated datagram's.
    let payload: Vec<u8> = (0..1450u32).map(|i| i as u8).collect();
    let mut g = udp_frame(Side::Inside, sub, 4000, REMOTE, 53, 64, &payload, false);
    set_dont_fragment(&mut g, false);
    assert_eq!(run(&mut e, &mut g, Side::Inside, SEC), Verdict::Consumed);
    let pieces = outputs(&mut e);
    assert_eq!(pieces.len(), 2);
    let mut data = Vec::new();
    for (i, (side, _, f)) in pieces.iter().enumerate() {
        assert_eq!(*side, Side::Outside);
        assert!(f.len() - ETH_LEN <= 1400, "fragment {i}: {} bytes", f.len() - ETH_LEN);
        let s = etherparse::SlicedPacket::from_ethernet(f).unwrap();
        let Some(etherparse::NetSlice::Ipv4(ip)) = s.net else { panic!("fragment {i} is not IPv4") };
        let h = ip.header().to_header();
        assert_eq!(h.header_checksum, h.calc_header_checksum());
        assert_eq!((h.more_fragments, usize::from(h.fragment_offset.value()) * 8), (i == 0, data.len()));
        assert!(in_pool(e.config(), addr_of(u32::from_be_bytes(h.source))) && h.destination == REMOTE && h.time_to_live == 63);
        data.extend_from_slice(ip.payload().payload);
    }
    let udp = etherparse::UdpSlice::from_slice(&data).unwrap();
    assert_eq!((udp.destination_port(), udp.payload()), (53, &payload[..]), "the whole datagram");
    let mut small = udp_frame(Side::Inside, sub, 4000, REMOTE, 53, 64, &[0u8; 1300], false);
    assert_eq!(run(&mut e, &mut small, Side::Inside, SEC), Verdict::Forward(Side::Outside));
}

#[test]
fn clearing_a_subscriber_removes_its_state_logs_it_and_leaves_others() {
    let mut e = engine(config());
    let (a, b) = ([100, 64, 0, 2], [100, 64, 0, 3]);
    for p in 0..5 {
        send_out(&mut e, a, 4000 + p, REMOTE, 53, SEC);
    }
    send_out(&mut e, b, 4000, REMOTE, 53, SEC);
    assert_eq!(e.session_views(Some(u32_of(a))).len(), 5);
    e.drain_events(|_| {});
    let mut deleted = 0;
    let c = e.clear_subscriber(u32_of(a), |ev| deleted += u32::from(ev.kind == EventKind::MappingDeleted && ev.int_addr == u32_of(a)));
    assert_eq!((c.sessions, c.mappings), (5, 5));
    assert_eq!(deleted, 5);
    assert!(e.session_views(Some(u32_of(a))).is_empty());
    assert_eq!(e.mapping_views(None).len(), 1);
    // Replies to the cleared mappings no longer pass.
    let mut r = udp_frame(Side::Outside, REMOTE, 53, addr_of(e.mapping_views(None)[0].ext_addr), 4001, 64, b"x", false);
    assert!(matches!(run(&mut e, &mut r, Side::Outside, 2 * SEC), Verdict::Drop(_) | Verdict::Forward(Side::Inside)));
}

/// `natrix show` lists a table a part at a time (`admin::Walk`): walked
/// one mapping a step, with sessions made and ended between the steps
/// (records freed ahead of the walk and reused), the listing holds every
/// session that lived throughout, none twice, no more than asked for.
#[test]
fn a_listing_walked_a_part_at_a_time_holds_what_lived_throughout() {
    use natrix_engine::admin::Walk;
    let mut e = engine(config());
    let subs: Vec<[u8; 4]> = (2..12).map(|i| [100, 64, 0, i]).collect();
    for (i, &sub) in subs.iter().enumerate() {
        for p in 0..3 {
            send_out(&mut e, sub, 4000 + p, REMOTE, 53 + i as u16, SEC);
        }
    }
    let gone = [100, 64, 0, 9];
    let lived: Vec<_> = e.session_views(None).into_iter().filter(|v| v.int_addr != u32_of(gone)).collect();
    assert_eq!(lived.len(), 27);
    let key = |v: &natrix_engine::admin::SessionView| (v.int_addr, v.int_port, v.ext_port);
    let mut w = Walk::new(None, usize::MAX);
    let mut steps = 0;
    while !e.walk_sessions(&mut w, 1) {
        steps += 1;
        assert!(steps < 1000, "the walk ends");
        match steps {
            // Ended ahead of the walk; their records are reused by the next ones.
            3 => drop(e.clear_subscriber(u32_of(gone), |_| {})),
            4..=8 => drop(send_out(&mut e, [100, 64, 1, steps as u8], 5000, REMOTE, 53, SEC)),
            _ => {}
        }
    }
    assert!(steps >= 27, "one mapping a step: {steps} steps");
    let mut listed: Vec<_> = w.rows.iter().map(key).collect();
    listed.sort_unstable();
    let before = listed.len();
    listed.dedup();
    assert_eq!(listed.len(), before, "no session twice");
    for v in &lived {
        assert!(listed.contains(&key(v)), "{v:?} lived throughout and is missing");
    }
    let mut three = Walk::new(None, 3);
    while !e.walk_sessions(&mut three, 1) {}
    assert_eq!(three.rows.len(), 3, "the limit");
    let mut one_sub = Walk::new(Some(u32_of(subs[4])), usize::MAX);
    while !e.walk_mappings(&mut one_sub, 2) {}
    assert_eq!(one_sub.rows.len(), 3);
    assert!(one_sub.rows.iter().all(|m| m.int_addr == u32_of(subs[4])));
}

/// `natrix clear` finds a subscriber's mappings a part at a time, then
/// ends their sessions: a mapping of its that ended meanwhile, its record
/// reused by another subscriber, is left to that subscriber.
#[test]
fn a_clear_walked_a_part_at_a_time_ends_only_the_subscribers_own() {
    use natrix_engine::admin::Walk;
    let mut e = engine(config());
    let (a, b) = ([100, 64, 0, 2], [100, 64, 0, 3]);
    for p in 0..4 {
        send_out(&mut e, a, 4000 + p, REMOTE, 53, SEC);
    }
    let mut w = Walk::new(Some(u32_of(a)), usize::MAX);
    while !e.walk_subscriber_mappings(&mut w, 1) {}
    assert_eq!(w.rows.len(), 4);
    // Past the UDP timeout every mapping of a has ended; b's new ones reuse the records.
    let later = 400 * SEC;
    for p in 0..4 {
        send_out(&mut e, b, 5000 + p, REMOTE, 53, later);
    }
    send_out(&mut e, a, 4100, REMOTE, 53, later);
    e.drain_events(|_| {});
    let reused = w.rows.iter().filter(|&&m| e.tables().is_live_mapping(m) && e.tables().mapping(m).int_addr == u32_of(b)).count();
    assert!(reused > 0, "the test needs a record of a's reused by b");
    let mut deleted = Vec::new();
    let c = e.clear_mappings(u32_of(a), &w.rows, |ev| deleted.push(ev.int_addr));
    assert!(deleted.iter().all(|&s| s != u32_of(b)), "b's sessions are not a's to clear");
    assert_eq!(e.session_views(Some(u32_of(b))).len(), 4);
    assert_eq!(c.sessions, 0, "a's mappings the walk found have all ended; its new one was made after the walk");
    assert_eq!(e.clear_subscriber(u32_of(a), |_| {}).sessions, 1, "a clear walked at once ends it");
}

#[test]
fn reload_applies_policy_removes_a_pool_address_with_its_mappings_and_refuses_restart_keys() {
    let mut cfg = config_single([203, 0, 113, 1]);
    cfg.pool.push(u32_of([203, 0, 113, 2]));
    let mut e = engine(cfg.clone());
    let sub = [100, 64, 0, 2];
    let (_, d) = send_out(&mut e, sub, 4000, REMOTE, 53, SEC);
    let used = d.src();
    e.drain_events(|_| {});

    let mut fewer = cfg.clone();
    fewer.pool.retain(|&a| a != u32_of(used));
    fewer.max_ports_per_subscriber = 1;
    let mut deleted = 0;
    e.reconfigure(fewer.clone(), |ev| deleted += u32::from(ev.kind == EventKind::MappingDeleted && ev.ext_addr == u32_of(used))).expect("policy and pool removal apply live");
    assert_eq!(deleted, 1, "the removed address's mapping is deleted and logged");
    let (v, d2) = send_out(&mut e, sub, 4001, REMOTE, 53, 2 * SEC);
    assert_eq!(v, Verdict::Forward(Side::Outside));
    assert_ne!(d2.src(), used, "never the removed address again");
    let (v, _) = send_out(&mut e, sub, 4002, REMOTE, 53, 2 * SEC);
    assert_eq!(v, Verdict::Drop(DropReason::PortQuota), "the new limit holds");

    let mut grown = fewer.clone();
    grown.ports = (2000, 3000);
    let err = e.reconfigure(grown, |_| {}).unwrap_err().to_string();
    assert!(err.contains("ports") && err.contains("restart"), "{err}");
    let mut added = fewer;
    added.pool.push(u32_of([203, 0, 113, 9]));
    added.pool.sort_unstable();
    e.reconfigure(added, |_| {}).expect("pool additions apply live");
    assert!(e.pool().contains(u32_of([203, 0, 113, 9])));
}

#[test]
fn the_memory_reserved_up_front_is_what_a_new_engine_holds() {
    for (max_sessions, max_subscribers, block) in [(1024, 64, 0), (100_000, 5000, 0), (65_536, 1024, 64)] {
        let cfg = EngineConfig { max_sessions, max_subscribers, port_block_size: block, ..config() };
        let e = engine(cfg.clone());
        assert_eq!(natrix_engine::Engine::reserved_bytes(&cfg), e.memory_bytes() as u64, "{max_sessions} sessions, block {block}");
    }
}

#[test]
fn a_reload_applies_the_fragment_limits_to_what_arrives_next() {
    use etherparse::Ethernet2Header;
    let mut e = engine(config());
    let eth = Ethernet2Header { source: MAC_SUB, destination: MAC_NAT_IN, ether_type: etherparse::EtherType::IPV4 };
    // A second fragment whose first has not come: held, one per datagram.
    let later = |ident: u16| ipv4_fragment(&eth, [100, 64, 0, 2], REMOTE, ident, 16, &[7u8; 24], false);
    assert_eq!(e.process(&mut later(1), Side::Inside, SEC), Verdict::Held);
    let mut one_held = config();
    one_held.max_held_fragments = 1;
    e.reconfigure(one_held.clone(), |_| {}).expect("fragment limits apply live");
    assert_eq!(e.process(&mut later(2), Side::Inside, SEC), Verdict::Held, "the newest is held");
    e.advance(SEC);
    assert_eq!(e.stats().drops.get(DropReason::FragmentBufferFull), 1, "the new limit holds: the oldest made room");
    let mut shorter = one_held;
    shorter.timeouts.fragment_ns = SEC / 2;
    e.reconfigure(shorter, |_| {}).expect("the fragment timeout applies live");
    assert_eq!(e.process(&mut later(3), Side::Inside, 2 * SEC), Verdict::Held);
    assert_eq!(e.stats().drops.get(DropReason::FragmentTimeout), 1, "the held fragment timed out under the new timeout");
    assert_eq!(e.stats().drops.get(DropReason::FragmentBufferFull), 1, "so none made room for the third");
}

#[test]
fn a_shorter_fragment_timeout_on_reload_ends_the_records_of_first_fragments_sooner() {
    use etherparse::Ethernet2Header;
    let mut e = engine(config());
    let eth = Ethernet2Header { source: MAC_SUB, destination: MAC_NAT_IN, ether_type: etherparse::EtherType::IPV4 };
    let sub = [100, 64, 0, 2];
    // A UDP header (ports 4000 to 53, length 40) and 8 bytes, then the rest.
    let mut first = ipv4_fragment(&eth, sub, REMOTE, 9, 0, &[0x0f, 0xa0, 0, 53, 0, 40, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8], true);
    assert_eq!(e.process(&mut first, Side::Inside, SEC), Verdict::Forward(Side::Outside));
    let mut shorter = config();
    shorter.timeouts.fragment_ns = SEC / 2;
    e.reconfigure(shorter, |_| {}).expect("the fragment timeout applies live");
    // Under the old timeout the first fragment's record would still stand.
    let mut later = ipv4_fragment(&eth, sub, REMOTE, 9, 16, &[9u8; 24], false);
    assert_eq!(e.process(&mut later, Side::Inside, 2 * SEC), Verdict::Held, "the record ended half a second after the reload");
}

/// A stop (or a clear, or a removed pool address) ends more mappings at once
/// than the event queue holds between drains: each deletion still reaches
/// the log, none is counted lost.
#[test]
fn a_bulk_deletion_larger_than_the_event_queue_logs_every_deletion() {
    let cfg = EngineConfig { event_capacity: 16, log_sessions: true, port_block_size: 64, ..config() };
    let mut e = engine(cfg.clone());
    let subscribers = 40u8;
    for i in 0..subscribers {
        send_out(&mut e, [100, 64, 1, i], 4000, REMOTE, 53, SEC);
        e.drain_events(|_| {});
    }
    let (mut sessions, mut mappings, mut blocks) = (0, 0, 0);
    let c = e.release_all(|ev| match ev.kind {
        EventKind::SessionDeleted => sessions += 1,
        EventKind::MappingDeleted => mappings += 1,
        EventKind::BlockReleased => blocks += 1,
        _ => {}
    });
    assert_eq!(c.mappings, u64::from(subscribers));
    assert_eq!((sessions, mappings, blocks), (40, 40, 40), "three events a deletion, every one handed over");
    assert_eq!(e.events_lost(), 0);

    // The same through a reload that removes the pool address in use.
    let mut e = engine(EngineConfig { pool: vec![u32_of([203, 0, 113, 1])], ..cfg.clone() });
    for i in 0..subscribers {
        send_out(&mut e, [100, 64, 1, i], 4000, REMOTE, 53, SEC);
        e.drain_events(|_| {});
    }
    let mut moved = cfg;
    moved.pool = vec![u32_of([203, 0, 113, 2])];
    let mut deleted = 0;
    e.reconfigure(moved, |ev| deleted += u32::from(ev.kind == EventKind::MappingDeleted)).expect("a pool address removed applies live");
    assert_eq!(deleted, 40);
    assert_eq!(e.events_lost(), 0);
}
