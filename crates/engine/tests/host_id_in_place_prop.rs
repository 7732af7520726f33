//! HOST_ID's insertion where a SYN lies (a batch of frames in buffers with
//! room: vectors, and buffers lent as the live dataplane lends them, with
//! or without enough room after the frame) against the copy `process` makes, for SYNs of any options layout
//! a host may send (EOL and padding anywhere, odd offsets, options that
//! leave no room), with a payload or Ethernet padding: both leave the same
//! bytes, which etherparse decodes with every checksum right, the TTL
//! decremented once, the host's options kept byte for byte and the
//! payload intact (seed 000 section 7; RFC 9293 section 3.1).

mod common;

use common::*;
use etherparse::PacketBuilder;
use natrix_engine::host_id::{HostIdConfig, Kinds, Mode, Origin, WingData};
use natrix_engine::{Engine, EngineConfig, InBuffer, Side, Verdict};
use proptest::prelude::*;

const SUB: [u8; 4] = [100, 64, 0, 10];
const SERVER: [u8; 4] = [198, 51, 100, 7];
const T0: u64 = 1_000 * SEC;

fn inserting() -> Engine {
    let h = HostIdConfig { mode: Mode::Syn, wing: Some(WingData::Ipv4Low16), boucadair: Some(Origin::PortIpv4), lifetime: 0, enabled: false, kinds: Kinds::DEFAULT, rules: vec![] };
    engine(EngineConfig { host_id: Some(h), ..config() })
}

/// One option a host may write: NOP, MSS, window scale, SACK permitted or timestamps.
fn host_option() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(vec![1]),
        any::<u16>().prop_map(|m| vec![2, 4, (m >> 8) as u8, m as u8]),
        (0u8..15).prop_map(|s| vec![3, 3, s]),
        Just(vec![4, 2]),
        any::<u64>().prop_map(|t| [vec![8, 10], t.to_be_bytes().to_vec()].concat()),
    ]
}

/// A host's options area: options, then maybe an EOL, padded to 4 bytes, at most 40.
fn options_area() -> impl Strategy<Value = Vec<u8>> {
    (proptest::collection::vec(host_option(), 0..6), any::<bool>()).prop_map(|(opts, eol)| {
        let mut area: Vec<u8> = Vec::new();
        for o in opts {
            if area.len() + o.len() <= 40 {
                area.extend_from_slice(&o);
            }
        }
        if eol && area.len() < 40 {
            area.push(0);
        }
        area.resize(area.len().next_multiple_of(4), 0);
        area
    })
}

fn syn(sport: u16, area: &[u8], payload: &[u8], padding: usize) -> Vec<u8> {
    let (ms, md) = macs(Side::Inside);
    let b = PacketBuilder::ethernet2(ms, md).ipv4(SUB, SERVER, 64).tcp(sport, 80, 77, 64240).syn().options_raw(area).expect("a whole options area");
    let mut v = Vec::new();
    b.write(&mut v, payload).unwrap();
    v.resize(v.len() + padding, 0xee);
    v
}

/// Where a host's options end: at the first EOL in a kind byte's place,
/// else at the area's end (RFC 9293 section 3.2).
fn options_end(area: &[u8]) -> usize {
    let mut at = 0;
    while at < area.len() {
        match area[at] {
            0 => return at,
            1 => at += 1,
            _ => at += usize::from(area[at + 1]),
        }
    }
    area.len()
}

/// `frame` through an inserting engine's batch path, lent in a buffer with
/// `room` bytes after it (`InBuffer`, as the live dataplane lends frames):
/// the verdict, the frame as it then lies, and what left through the
/// output queue.
fn lent_in_buffer(frame: &[u8], room: usize) -> (Verdict, Vec<u8>, Vec<Vec<u8>>) {
    let mut e = inserting();
    let mut buffer = frame.to_vec();
    buffer.resize(frame.len() + room, 0xaa);
    let mut lent = [InBuffer::new(&mut buffer, 0, frame.len())];
    let mut verdicts = [Verdict::Held];
    e.process_batch(&mut lent, Side::Inside, T0, &mut verdicts);
    let (start, len) = (lent[0].start(), lent[0].len());
    let queued = outputs(&mut e).into_iter().map(|(_, _, f)| f).collect();
    (verdicts[0], buffer[start..start + len].to_vec(), queued)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn a_syn_grown_where_it_lies_is_the_copy_process_sends(
        area in options_area(),
        payload in proptest::collection::vec(any::<u8>(), 0..40),
        padding in 0usize..8,
        sport in 1024u16..65535,
        room in 0usize..24,
    ) {
        let original = syn(sport, &area, &payload, padding);

        let mut one = inserting();
        let mut copy = original.clone();
        let v_one = one.process(&mut copy, Side::Inside, T0);
        let queued: Vec<Vec<u8>> = outputs(&mut one).into_iter().map(|(_, _, f)| f).collect();

        let mut batched = inserting();
        let mut frames = vec![original.clone()];
        let mut verdicts = [Verdict::Held];
        batched.process_batch(&mut frames, Side::Inside, T0, &mut verdicts);
        prop_assert!(outputs(&mut batched).is_empty(), "nothing leaves through the output queue");
        prop_assert_eq!(verdicts[0], Verdict::Forward(Side::Outside));

        // WING (4) and BOUCADAIR (10) fit when the host left room for 14 bytes.
        let host_end = options_end(&area);
        let fits = host_end + 14 <= 40;
        let out = if fits {
            prop_assert_eq!(v_one, Verdict::Held);
            prop_assert_eq!(queued.len(), 1);
            prop_assert_eq!(&frames[0], &queued[0]);
            frames[0].clone()
        } else {
            prop_assert_eq!(v_one, Verdict::Forward(Side::Outside));
            prop_assert!(queued.is_empty());
            prop_assert_eq!(&frames[0], &copy);
            copy
        };
        // Lent with `room` bytes after it: grown where it lies when they
        // hold the growth (at most 16 bytes; the Ethernet padding a grown
        // frame sheds not counted), else sent as the copy.
        let (v_lent, lent, lent_queued) = lent_in_buffer(&original, room);
        let growth = (frames[0].len() + padding).saturating_sub(original.len());
        if fits && growth > room {
            prop_assert_eq!(v_lent, Verdict::Held);
            prop_assert_eq!(&lent_queued, &vec![frames[0].clone()]);
        } else {
            prop_assert_eq!(v_lent, Verdict::Forward(Side::Outside));
            prop_assert!(lent_queued.is_empty());
            prop_assert_eq!(&lent, &frames[0]);
        }
        let d = must_decode(&out);
        prop_assert_eq!(d.ip.time_to_live, 63);
        prop_assert_eq!(&d.payload, &payload);
        if fits {
            prop_assert_eq!(usize::from(d.ip.total_len) + ETH_LEN, out.len(), "a grown frame ends where its packet ends");
        }
        let tcp = d.tcp();
        let opts = tcp.options.as_slice();
        prop_assert_eq!(&opts[..host_end], &area[..host_end], "the host's options, byte for byte");
        if fits {
            let (port, addr) = (sport.to_be_bytes(), [100, 64, 0, 10]);
            prop_assert_eq!(&opts[host_end..host_end + 4], &[Kinds::DEFAULT.wing, 4, 0, 10][..]);
            let b = &opts[host_end + 4..host_end + 14];
            prop_assert_eq!(&b[..3], &[Kinds::DEFAULT.boucadair, 10, 2][..]);
            prop_assert_eq!(&b[3..5], &port[..]);
            prop_assert_eq!(&b[5..9], &addr[..]);
        }
    }
}
