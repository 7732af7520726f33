//! A reply to a softwire host that arrives in fragments, the later one
//! first, is held until its first fragment and then released; in a batch,
//! the flow's next reply must still leave after both fragments, as it does
//! frame by frame (released fragments are encapsulated where they wait in
//! the output queue, not behind what was queued after them). Frames built
//! with etherparse and split by hand (RFC 791 fragmentation).

mod common;

use common::*;
use natrix_engine::dslite::DsliteConfig;
use natrix_engine::{Engine, EngineConfig, Side, Verdict};

const AFTR: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1];
const B4: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
const REMOTE: [u8; 4] = [198, 51, 100, 7];
/// Where the inner IPv4 header of an encapsulated frame starts.
const INNER: usize = 14 + 40;

fn engine_ds() -> Engine {
    engine(EngineConfig { dslite: Some(DsliteConfig { aftr: AFTR.into(), b4_prefixes: vec![], mtu: 1500, mss_clamp: None, ecn_compatibility: false }), ..config() })
}

/// Opens a flow from the host behind `B4`; its external address and port.
fn open_flow(e: &mut Engine) -> ([u8; 4], u16) {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ipv4([192, 0, 0, 2], REMOTE, 64).udp(5000, 53).write(&mut v, b"query").unwrap();
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(MAC_SUB, MAC_NAT_IN).ipv6(B4, AFTR, 64).write(&mut f, etherparse::IpNumber(4), &v).unwrap();
    assert_eq!(run(e, &mut f, Side::Inside, SEC), Verdict::Consumed);
    let out = outputs(e);
    let d = must_decode(&out[0].2);
    (d.src(), d.udp().source_port)
}

fn set_ip_checksum(f: &mut [u8]) {
    f[24..26].fill(0);
    let sum: u32 = f[14..34].chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    f[24..26].copy_from_slice(&(!((folded & 0xffff) + (folded >> 16)) as u16).to_be_bytes());
}

/// The reply datagram split after 32 bytes of UDP: (first fragment, second fragment).
fn fragmented_reply((ext, port): ([u8; 4], u16)) -> (Vec<u8>, Vec<u8>) {
    let whole = udp_frame(Side::Outside, REMOTE, 53, ext, port, 64, &[0x5a; 64], false);
    let l4 = &whole[34..];
    let piece = |bytes: &[u8], flags_offset: u16| {
        let mut f = whole[..34].to_vec();
        f.extend_from_slice(bytes);
        f[16..18].copy_from_slice(&(20 + bytes.len() as u16).to_be_bytes());
        f[18..20].copy_from_slice(&0x4242u16.to_be_bytes());
        f[20..22].copy_from_slice(&flags_offset.to_be_bytes());
        set_ip_checksum(&mut f);
        f
    };
    (piece(&l4[..32], 0x2000), piece(&l4[32..], 32 / 8))
}

/// What left, in order, each named by its inner packet: "first" and
/// "second" fragment, or "whole".
fn names(left: &[Vec<u8>]) -> Vec<&'static str> {
    left.iter()
        .map(|f| match u16::from_be_bytes([f[INNER + 6], f[INNER + 7]]) {
            0x2000 => "first",
            4 => "second",
            0 | 0x4000 => "whole",
            other => panic!("unexpected fragment field {other:#x}"),
        })
        .collect()
}

#[test]
fn a_reply_batched_behind_a_fragmented_one_leaves_after_both_its_fragments() {
    let (mut one_by_one, mut batched) = (engine_ds(), engine_ds());
    let ext = open_flow(&mut one_by_one);
    assert_eq!(open_flow(&mut batched), ext, "both engines map the flow alike");
    let (first, second) = fragmented_reply(ext);
    let next = udp_frame(Side::Outside, REMOTE, 53, ext.0, ext.1, 64, b"next", false);
    let arrivals = [second, first, next];

    let mut left_one_by_one = Vec::new();
    for f in &arrivals {
        let mut f = f.clone();
        if let Verdict::Forward(_) = one_by_one.process(&mut f, Side::Outside, 2 * SEC) {
            left_one_by_one.push(f);
        }
        left_one_by_one.extend(outputs(&mut one_by_one).into_iter().map(|o| o.2));
    }
    let mut frames = arrivals.to_vec();
    let mut verdicts = [Verdict::Held; 3];
    batched.process_batch(&mut frames, Side::Outside, 2 * SEC, &mut verdicts);
    let mut left_batched: Vec<Vec<u8>> = frames.iter().zip(verdicts).filter(|(_, v)| matches!(v, Verdict::Forward(_))).map(|(f, _)| f.clone()).collect();
    left_batched.extend(outputs(&mut batched).into_iter().map(|o| o.2));

    for left in [&left_one_by_one, &left_batched] {
        assert!(left.iter().all(|f| f[12..14] == [0x86, 0xdd] && f[38..54] == B4), "every frame encapsulated to the B4");
        assert_eq!(names(left).last(), Some(&"whole"), "the next reply last: {:?}", names(left));
        assert_eq!(left.len(), 3);
    }
    assert_eq!(names(&left_batched), names(&left_one_by_one));
}
