//! NPTv6 (RFC 6296) through the engine: frames built and checked with
//! etherparse, not natrix's wire code.
//!
//! - RFC 6296 section 3.6's example, both ways, checksum untouched.
//! - Property: for any binding and host, the frame leaves with the outside
//!   prefix, its transport checksum the same bytes and still valid, and
//!   the reply comes back to the original address.
//! - Differential: NPTv6's fast path decides exactly as the full path, over
//!   intact and damaged frames (`process` against `process_full`, and
//!   `process_batch` against both).
//! - A reload replaces the table; a refused one leaves it.

use std::net::Ipv6Addr;

use etherparse::{IcmpEchoHeader, Icmpv6Type, PacketBuilder, SlicedPacket, TransportSlice};
use natrix_engine::nptv6::Binding;
use natrix_engine::{DropReason, Engine, EngineConfig, Side, Verdict};
use proptest::prelude::*;

const NS: u64 = 1_000_000_000;
const SERVER: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, 0x20);

fn a(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn rfc_binding() -> Binding {
    Binding { inside: a("fd01:203:405::"), outside: a("2001:db8:1::"), prefix_len: 48 }
}

fn engine(bindings: Vec<Binding>, translate: bool) -> Engine {
    let pool = if translate { vec![u32::from_be_bytes([203, 0, 113, 1])] } else { Vec::new() };
    Engine::new(EngineConfig { translate, pool, nptv6: bindings, ..EngineConfig::default() }).unwrap()
}

fn udp6(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8, payload: &[u8]) -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv6(src.octets(), dst.octets(), hop_limit).udp(40000, 53);
    let mut f = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut f, payload).unwrap();
    f
}

fn tcp6(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8) -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv6(src.octets(), dst.octets(), hop_limit).tcp(40001, 443, 1000, 65535).syn();
    let mut f = Vec::with_capacity(b.size(0));
    b.write(&mut f, &[]).unwrap();
    f
}

fn echo6(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8) -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv6(src.octets(), dst.octets(), hop_limit)
        .icmpv6(Icmpv6Type::EchoRequest(IcmpEchoHeader { id: 7, seq: 1 }));
    let mut f = Vec::with_capacity(b.size(4));
    b.write(&mut f, b"ping").unwrap();
    f
}

/// An ICMPv6 destination unreachable from `src` to `dst` quoting `quoted`
/// (an Ethernet frame; its IPv6 packet is quoted).
fn unreachable6(src: Ipv6Addr, dst: Ipv6Addr, quoted: &[u8]) -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv6(src.octets(), dst.octets(), 64)
        .icmpv6(Icmpv6Type::DestinationUnreachable(etherparse::icmpv6::DestUnreachableCode::Port));
    let mut f = Vec::with_capacity(b.size(quoted.len() - 14));
    b.write(&mut f, &quoted[14..]).unwrap();
    f
}

fn addrs(frame: &[u8]) -> (Ipv6Addr, Ipv6Addr, u8) {
    let s = SlicedPacket::from_ethernet(frame).unwrap();
    let Some(etherparse::NetSlice::Ipv6(ip)) = s.net else { panic!("not IPv6") };
    let h = ip.header();
    (h.source_addr(), h.destination_addr(), h.hop_limit())
}

/// The addresses of the packet an ICMPv6 error quotes (after Ethernet 14,
/// IPv6 40 and the ICMPv6 header 8).
fn quoted_addrs(frame: &[u8]) -> (Ipv6Addr, Ipv6Addr) {
    let h = etherparse::Ipv6HeaderSlice::from_slice(&frame[62..]).unwrap();
    (h.source_addr(), h.destination_addr())
}

fn prefix48(addr: Ipv6Addr) -> u128 {
    u128::from(addr) >> 80
}

/// The transport checksum field, and whether it verifies (etherparse).
fn transport_checksum(frame: &[u8]) -> (u16, bool) {
    let s = SlicedPacket::from_ethernet(frame).unwrap();
    let Some(etherparse::NetSlice::Ipv6(ip)) = &s.net else { panic!("not IPv6") };
    let h = ip.header().to_header();
    match s.transport.unwrap() {
        TransportSlice::Udp(u) => (u.checksum(), u.to_header().calc_checksum_ipv6(&h, u.payload()).unwrap() == u.checksum()),
        TransportSlice::Tcp(t) => (t.checksum(), t.to_header().calc_checksum_ipv6(&h, t.payload()).unwrap() == t.checksum()),
        TransportSlice::Icmpv6(i) => (i.checksum(), i.icmp_type().calc_checksum(h.source, h.destination, i.payload()).unwrap() == i.checksum()),
        other => panic!("unexpected transport {other:?}"),
    }
}

#[test]
fn the_rfc_example_both_ways_with_the_checksum_untouched() {
    let mut e = engine(vec![rfc_binding()], false);
    let mut out = udp6(a("fd01:203:405:1::1234"), SERVER, 64, b"rfc 6296");
    let sent = transport_checksum(&out);
    assert_eq!(e.process(&mut out, Side::Inside, NS), Verdict::Forward(Side::Outside));
    assert_eq!(addrs(&out), (a("2001:db8:1:d550::1234"), SERVER, 63));
    assert_eq!(transport_checksum(&out), (sent.0, true), "the checksum is the same bytes and still verifies");
    let mut back = udp6(SERVER, a("2001:db8:1:d550::1234"), 64, b"reply");
    assert_eq!(e.process(&mut back, Side::Outside, NS), Verdict::Forward(Side::Inside));
    assert_eq!(addrs(&back), (SERVER, a("fd01:203:405:1::1234"), 63));
    assert!(transport_checksum(&back).1);
    assert_eq!(e.stats().nptv6_translated, [1, 1]);
}

/// B4s in a prefix NPTv6 maps: their softwire packets to the AFTR are
/// DS-Lite's, decapsulated and translated by NAPT44 on every path (the
/// full path asks DS-Lite first; NPTv6's fast path must leave them), and
/// other IPv6 to the AFTR is natrix's own, never forwarded.
#[test]
fn softwires_from_a_prefix_nptv6_maps_are_the_aftrs() {
    let aftr = a("2001:db8:0:1::1");
    let cfg = EngineConfig {
        pool: vec![u32::from_be_bytes([203, 0, 113, 1])],
        nptv6: vec![rfc_binding()],
        dslite: Some(natrix_engine::dslite::DsliteConfig { aftr, b4_prefixes: vec![], mtu: 1500, mss_clamp: None, ecn_compatibility: false }),
        ..EngineConfig::default()
    };
    let b4 = a("fd01:203:405:1::7");
    let softwire = || {
        let mut inner = Vec::new();
        PacketBuilder::ipv4([192, 0, 0, 2], [198, 51, 100, 7], 64).udp(5000, 53).write(&mut inner, &[7; 64]).unwrap();
        let mut f = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv6(b4.octets(), aftr.octets(), 64).write(&mut f, etherparse::IpNumber(4), &inner).unwrap();
        f
    };
    for batched in [false, true] {
        let mut e = Engine::new(cfg.clone()).unwrap();
        for n in 0..3 {
            let mut f = softwire();
            let v = if batched {
                let mut frames = [f];
                let mut verdicts = [Verdict::Held];
                e.process_batch(&mut frames, Side::Inside, NS + n, &mut verdicts);
                f = frames.into_iter().next().unwrap();
                verdicts[0]
            } else {
                e.process(&mut f, Side::Inside, NS + n)
            };
            let mut left = Vec::new();
            e.drain_output(|o| left.push(o.data.clone()));
            if v == Verdict::Forward(Side::Outside) {
                left.push(f);
            }
            assert_eq!(left.len(), 1, "packet {n} (batched: {batched}): {v:?}");
            let p = SlicedPacket::from_ethernet(&left[0]).unwrap();
            let Some(etherparse::NetSlice::Ipv4(ip)) = p.net else { panic!("packet {n} left as IPv6, not decapsulated") };
            assert_eq!(ip.header().source(), [203, 0, 113, 1], "translated by NAPT44");
        }
        assert_eq!(e.stats().nptv6_translated, [0, 0]);
        let mut to_aftr = udp6(b4, aftr, 64, b"to the aftr");
        assert_eq!(e.process(&mut to_aftr, Side::Inside, 2 * NS), Verdict::Drop(DropReason::LocalDestination));
    }
}

#[test]
fn unmappable_addresses_are_dropped_and_counted_both_ways() {
    let mut e = engine(vec![rfc_binding()], true);
    let mut out = udp6(a("fd01:203:405:ffff::1"), SERVER, 64, b"x");
    assert_eq!(e.process(&mut out, Side::Inside, NS), Verdict::Drop(DropReason::Nptv6Unmappable));
    let mut back = udp6(SERVER, a("2001:db8:1:ffff::1"), 64, b"x");
    assert_eq!(e.process_full(&mut back, Side::Outside, NS), Verdict::Drop(DropReason::Nptv6Unmappable));
    assert_eq!(e.stats().drops.get(DropReason::Nptv6Unmappable), 2);
}

#[test]
fn icmpv6_errors_map_the_quoted_packet_the_other_way() {
    let mut e = engine(vec![rfc_binding()], false);
    let host = a("fd01:203:405:1::1234");
    let external = a("2001:db8:1:d550::1234");
    // An outside router's error about a packet the host sent (as it left natrix).
    let about = udp6(external, SERVER, 3, b"probe");
    let mut err = unreachable6(a("2001:db8:ff::1"), external, &about);
    assert_eq!(e.process(&mut err, Side::Outside, NS), Verdict::Forward(Side::Inside));
    assert_eq!(addrs(&err).1, host);
    assert!(transport_checksum(&err).1, "the ICMPv6 checksum still verifies");
    assert_eq!(quoted_addrs(&err).0, host, "the quoted source is the host's own address");
    // The host's error about a packet it was sent.
    let about = udp6(SERVER, host, 60, b"to host");
    let mut err = unreachable6(host, SERVER, &about);
    assert_eq!(e.process(&mut err, Side::Inside, NS), Verdict::Forward(Side::Outside));
    assert_eq!(addrs(&err).0, external);
    assert!(transport_checksum(&err).1);
    assert_eq!(quoted_addrs(&err).1, external, "the quoted destination is the host's external address");
}

#[test]
fn a_reload_replaces_the_table_and_a_refused_one_keeps_it() {
    let mut e = engine(vec![rfc_binding()], false);
    let other = Binding { inside: a("fd01:203:405::"), outside: a("2001:db8:9::"), prefix_len: 48 };
    e.reconfigure(EngineConfig { translate: false, nptv6: vec![other], ..EngineConfig::default() }, |_| {}).unwrap();
    let mut f = udp6(a("fd01:203:405:1::1234"), SERVER, 64, b"x");
    e.process(&mut f, Side::Inside, NS);
    assert_eq!(prefix48(addrs(&f).0), prefix48(a("2001:db8:9::")));
    let bad = Binding { inside: a("fd01::"), outside: a("2001:db8::"), prefix_len: 80 };
    assert!(e.reconfigure(EngineConfig { translate: false, nptv6: vec![bad], ..EngineConfig::default() }, |_| {}).is_err());
    let mut f = udp6(a("fd01:203:405:1::1234"), SERVER, 64, b"x");
    e.process(&mut f, Side::Inside, NS);
    assert_eq!(prefix48(addrs(&f).0), prefix48(a("2001:db8:9::")), "the refused reload left the table");
}

/// RFC 6296 section 4.3: NPTv6 translators MUST support hairpinning. A
/// host reaching another host of the site by its external address: the
/// source mapped out, the destination mapped in, and back inside; the
/// reply the same way round; checksums untouched.
#[test]
fn a_host_reaching_another_by_its_external_address_is_hairpinned() {
    let b = rfc_binding();
    let (host_a, host_b) = (a("fd01:203:405:1::1234"), a("fd01:203:405:2::5678"));
    let (ext_a, ext_b) = (reference_map(&b, host_a).unwrap(), reference_map(&b, host_b).unwrap());
    assert_eq!(ext_a, a("2001:db8:1:d550::1234"), "RFC 6296 section 3.5's example");
    for translate in [false, true] {
        let mut e = engine(vec![b], translate);
        let mut f = udp6(host_a, ext_b, 64, b"hairpin");
        let sent = transport_checksum(&f);
        assert_eq!(e.process(&mut f, Side::Inside, NS), Verdict::Forward(Side::Inside));
        assert_eq!(addrs(&f), (ext_a, host_b, 63));
        assert_eq!(transport_checksum(&f), (sent.0, true));
        let mut reply = tcp6(host_b, ext_a, 64);
        assert_eq!(e.process(&mut reply, Side::Inside, NS), Verdict::Forward(Side::Inside));
        assert_eq!(addrs(&reply), (ext_b, host_a, 63));
        assert!(transport_checksum(&reply).1);
        // An error about the hairpinned packet, from host B: the quote is
        // what host A sent, as A knows it.
        let quoted = udp6(host_a, ext_b, 63, b"hairpin");
        let mut as_b_saw_it = quoted.clone();
        as_b_saw_it[22..38].copy_from_slice(&ext_a.octets());
        as_b_saw_it[38..54].copy_from_slice(&host_b.octets());
        let mut err = unreachable6(host_b, ext_a, &as_b_saw_it);
        assert_eq!(e.process(&mut err, Side::Inside, NS), Verdict::Forward(Side::Inside));
        assert_eq!(addrs(&err).0, ext_b);
        assert_eq!(addrs(&err).1, host_a);
        assert_eq!(quoted_addrs(&err), (host_a, ext_b));
    }
}

/// From inside to a binding's inside prefix (another site, or natrix's
/// own link): back inside untranslated, never out with a mapped source and
/// a site-local destination; to natrix's own address: nowhere.
#[test]
fn inside_prefixes_and_natrix_itself_never_leave_outside() {
    let sites = vec![rfc_binding(), Binding { inside: a("fd02::"), outside: a("2001:db8:2::"), prefix_len: 48 }];
    let own = a("fd01:203:405:1::1");
    let cfg = EngineConfig { translate: false, nptv6: sites, inside_addr6: Some(natrix_engine::config::Addr6 { addr: own, prefix_len: 64 }), ..EngineConfig::default() };
    for batched in [false, true] {
        let mut e = Engine::new(cfg.clone()).unwrap();
        let mut run = |f: &mut Vec<u8>| {
            if batched {
                let mut frames = [std::mem::take(f)];
                let mut verdicts = [Verdict::Held];
                e.process_batch(&mut frames, Side::Inside, NS, &mut verdicts);
                *f = frames.into_iter().next().unwrap();
                verdicts[0]
            } else {
                e.process(f, Side::Inside, NS)
            }
        };
        let host = a("fd01:203:405:1::1234");
        let mut other_site = udp6(host, a("fd02:0:0:7::9"), 64, b"to another site");
        assert_eq!(run(&mut other_site), Verdict::Forward(Side::Inside), "batched: {batched}");
        assert_eq!(addrs(&other_site), (host, a("fd02:0:0:7::9"), 63), "untranslated");
        let mut to_natrix = udp6(host, own, 64, b"to natrix");
        assert_eq!(run(&mut to_natrix), Verdict::Drop(DropReason::LocalDestination), "batched: {batched}");
    }
}

/// With DS-Lite on, IPv4 in IPv6 from a site host to another address than
/// the AFTR is the host's own tunnel, NPTv6's, when the B4 prefixes are
/// listed apart from the sites; from a listed B4 it is still the wrong AFTR.
#[test]
fn a_site_hosts_own_ipv4_in_ipv6_tunnel_is_nptv6s() {
    let aftr = a("2001:db8:0:1::1");
    let b4s = vec![natrix_engine::dslite::B4Prefix { network: a("2001:db8:100::"), len: 48 }];
    let cfg = EngineConfig {
        pool: vec![u32::from_be_bytes([203, 0, 113, 1])],
        nptv6: vec![rfc_binding()],
        dslite: Some(natrix_engine::dslite::DsliteConfig { aftr, b4_prefixes: b4s, mtu: 1500, mss_clamp: None, ecn_compatibility: false }),
        ..EngineConfig::default()
    };
    let tunnel = |src: Ipv6Addr| {
        let mut inner = Vec::new();
        PacketBuilder::ipv4([10, 9, 9, 9], [198, 51, 100, 7], 64).udp(5000, 53).write(&mut inner, &[7; 16]).unwrap();
        let mut f = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv6(src.octets(), a("2001:db8:99::1").octets(), 64)
            .write(&mut f, etherparse::IpNumber(4), &inner)
            .unwrap();
        f
    };
    let mut e = Engine::new(cfg).unwrap();
    let host = a("fd01:203:405:1::7");
    let mut f = tunnel(host);
    assert_eq!(e.process(&mut f, Side::Inside, NS), Verdict::Forward(Side::Outside));
    assert_eq!(addrs(&f).0, reference_map(&rfc_binding(), host).unwrap());
    let mut from_b4 = tunnel(a("2001:db8:100::2"));
    assert_eq!(e.process(&mut from_b4, Side::Inside, NS), Verdict::Drop(DropReason::DsliteWrongAftr));
}

fn mask(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
}

fn any_binding() -> impl Strategy<Value = Binding> {
    (1u8..=64, any::<u128>(), any::<u128>(), any::<bool>()).prop_filter_map("distinct prefixes", |(len, i, o, ula)| {
        let inside = if ula { 0xfd << 120 | i >> 8 } else { i } & mask(len);
        let b = Binding { inside: Ipv6Addr::from(inside), outside: Ipv6Addr::from(o & mask(len)), prefix_len: len };
        // SERVER stays outside both prefixes: a packet to it from inside
        // then leaves outside (to a prefix it would hairpin or go back inside).
        let covers_server = [b.inside, b.outside].iter().any(|p| u128::from(SERVER) & mask(len) == u128::from(*p));
        (natrix_engine::nptv6::check_bindings(&[b]).is_ok() && !covers_server).then_some(b)
    })
}

fn host_in(b: &Binding, host: u128) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(b.inside) | host & !mask(b.prefix_len))
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Udp,
    Tcp,
    Echo,
}

fn frame_of(kind: Kind, src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8) -> Vec<u8> {
    match kind {
        Kind::Udp => udp6(src, dst, hop_limit, b"payload"),
        Kind::Tcp => tcp6(src, dst, hop_limit),
        Kind::Echo => echo6(src, dst, hop_limit),
    }
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![Just(Kind::Udp), Just(Kind::Tcp), Just(Kind::Echo)]
}

/// The RFC's mapping on `u128`s, written from section 3 apart from the
/// engine's: prefix replaced, the sum difference added to the chosen word.
fn reference_map(b: &Binding, addr: Ipv6Addr) -> Option<Ipv6Addr> {
    let add = |x: u32, y: u32| {
        let s = x + y;
        (s & 0xffff) + (s >> 16)
    };
    let sum = |p: Ipv6Addr| p.segments().iter().fold(0u32, |acc, &w| add(acc, u32::from(w)));
    let adj = add(sum(b.inside), !sum(b.outside) & 0xffff);
    let mut w = (u128::from(addr) & !mask(b.prefix_len) | u128::from(b.outside)).to_be_bytes();
    let word = if b.prefix_len <= 48 { (addr.segments()[3] != 0xffff).then_some(3) } else { (4..8).find(|&i| addr.segments()[i] != 0xffff) }?;
    let v = match add(u32::from(u16::from_be_bytes([w[2 * word], w[2 * word + 1]])), adj) {
        0xffff => 0,
        v => v as u16,
    };
    w[2 * word..2 * word + 2].copy_from_slice(&v.to_be_bytes());
    Some(Ipv6Addr::from(w))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// For any binding and any host under it: out with the outside prefix
    /// as section 3 computes it, the transport checksum the same bytes and
    /// valid, and the reply back at the host's own address.
    #[test]
    fn out_and_back_checksum_neutral(b in any_binding(), host in any::<u128>(), k in kind(), translate in any::<bool>()) {
        let mut e = engine(vec![b], translate);
        let src = host_in(&b, host);
        let mut out = frame_of(k, src, SERVER, 64);
        let sent = transport_checksum(&out);
        let v = e.process(&mut out, Side::Inside, NS);
        let Some(external) = reference_map(&b, src) else {
            prop_assert_eq!(v, Verdict::Drop(DropReason::Nptv6Unmappable));
            return Ok(());
        };
        prop_assert_eq!(v, Verdict::Forward(Side::Outside));
        prop_assert_eq!(addrs(&out), (external, SERVER, 63));
        prop_assert_eq!(transport_checksum(&out), (sent.0, true));
        let mut back = frame_of(k, SERVER, external, 64);
        prop_assert_eq!(e.process(&mut back, Side::Outside, NS), Verdict::Forward(Side::Inside));
        prop_assert_eq!(addrs(&back), (SERVER, src, 63));
        prop_assert!(transport_checksum(&back).1);
    }

    /// NPTv6's fast path and the full path agree on every frame: intact,
    /// or with a byte of its Ethernet or IPv6 header changed, or cut short;
    /// one frame at a time and in a batch.
    #[test]
    fn fast_path_equals_full_path(b in any_binding(), host in any::<u128>(), other in any::<u128>(), to in 0u8..5, k in kind(), inbound in any::<bool>(),
                                  damage in proptest::option::of((0usize..62, any::<u8>())), cut in proptest::option::of(0usize..62)) {
        let src = host_in(&b, host);
        // natrix's own inside address, in the site's prefix; and where a
        // packet goes: the server, another host of the site, another
        // host's external address (hairpinned, or unmappable), natrix.
        let own = host_in(&b, other ^ 1);
        let outside_image = |h: Ipv6Addr| Ipv6Addr::from(u128::from(b.outside) | u128::from(h) & !mask(b.prefix_len));
        let dst = match to {
            0 => SERVER,
            1 => host_in(&b, other),
            2 => outside_image(host_in(&b, other)),
            3 => own,
            _ => reference_map(&b, own).unwrap_or(SERVER),
        };
        let (mut frame, side) = match (inbound, reference_map(&b, src)) {
            (true, Some(external)) if to < 4 => (frame_of(k, SERVER, external, 64), Side::Outside),
            (true, _) => (frame_of(k, SERVER, dst, 64), Side::Outside),
            _ => (frame_of(k, src, dst, 64), Side::Inside),
        };
        if let Some((at, v)) = damage {
            let at = at % frame.len();
            frame[at] = v;
        }
        if let Some(len) = cut {
            frame.truncate(len);
        }
        let with_own = || Engine::new(EngineConfig {
            translate: false,
            nptv6: vec![b],
            inside_addr6: Some(natrix_engine::config::Addr6 { addr: own, prefix_len: 64 }),
            ..EngineConfig::default()
        }).unwrap();
        let (mut fast, mut full, mut batch) = (with_own(), with_own(), with_own());
        let (mut f1, mut f2) = (frame.clone(), frame.clone());
        let mut batch_frames = vec![frame.clone(), frame];
        let v1 = fast.process(&mut f1, side, NS);
        let v2 = full.process_full(&mut f2, side, NS);
        let mut vs = [Verdict::Held; 2];
        batch.process_batch(&mut batch_frames, side, NS, &mut vs);
        prop_assert_eq!(v1, v2);
        prop_assert_eq!(&f1, &f2);
        prop_assert_eq!(vs, [v1, v1]);
        prop_assert_eq!(&batch_frames[0], &f1);
        let (s1, s2) = (fast.stats(), full.stats());
        prop_assert_eq!(s1.forwarded, s2.forwarded);
        prop_assert_eq!(s1.drops.total(), s2.drops.total());
        prop_assert_eq!(s1.nptv6_translated, s2.nptv6_translated);
    }
}
