//! Middlebox functions in the pipeline: a function sees exactly the frames
//! it declares an interest in, at its point (before or after translation),
//! in the per-frame and the batch path alike; its drop is counted under its
//! reason; frames it does not want keep NAPT44's translation unchanged.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use natrix_engine::pipeline::hooks::{FrameInfo, HookVerdict, Interest, Middlebox, Point};
use natrix_engine::{DropReason, Side, Verdict};

const SUB: [u8; 4] = [100, 64, 0, 10];
const SERVER: [u8; 4] = [198, 51, 100, 7];
const SYN: u8 = 0x02;

/// What a function saw: each frame's side, TCP flags and source address.
type Seen = Arc<Mutex<Vec<(Side, u8, u32)>>>;

struct Recorder {
    point: Point,
    interest: Interest,
    seen: Seen,
    drop_port: Option<u16>,
}

impl Middlebox for Recorder {
    fn point(&self) -> Point {
        self.point
    }

    fn interest(&self) -> Interest {
        self.interest
    }

    fn on_frame(&mut self, frame: &mut [u8], info: &FrameInfo) -> HookVerdict {
        self.seen.lock().unwrap().push((info.side, info.tcp_flags, info.src));
        let dport = u16::from_be_bytes([frame[info.l4 + 2], frame[info.l4 + 3]]);
        match self.drop_port {
            Some(p) if p == dport => HookVerdict::Drop(DropReason::Filtered),
            _ => HookVerdict::Continue,
        }
    }
}

fn with_recorder(point: Point, interest: Interest, drop_port: Option<u16>) -> (natrix_engine::Engine, Seen) {
    let seen = Seen::default();
    let mut e = engine(config());
    e.add_middlebox(Box::new(Recorder { point, interest, seen: seen.clone(), drop_port }));
    (e, seen)
}

/// A TCP connection's segments both ways and a UDP exchange, as frames.
fn traffic(e: &mut natrix_engine::Engine) -> Vec<(Side, Vec<u8>)> {
    let mut out = Vec::new();
    let mut syn = tcp_frame(Side::Inside, SUB, 40000, SERVER, 80, 64, TcpKind::Syn, 1, 0, b"");
    assert_eq!(run(e, &mut syn, Side::Inside, SEC), Verdict::Forward(Side::Outside));
    let ext = must_decode(&syn);
    let (ext_addr, ext_port) = (ext.ip.source, ext.tcp().source_port);
    out.push((Side::Outside, tcp_frame(Side::Outside, SERVER, 80, ext_addr, ext_port, 64, TcpKind::SynAck, 9, 2, b"")));
    for _ in 0..3 {
        out.push((Side::Inside, tcp_frame(Side::Inside, SUB, 40000, SERVER, 80, 64, TcpKind::Ack, 2, 10, b"data data data")));
    }
    out.push((Side::Inside, udp_frame(Side::Inside, SUB, 5000, SERVER, 53, 64, b"a query of some length", false)));
    out
}

#[test]
fn a_function_sees_only_the_frames_it_wants_at_its_point() {
    let (mut e, seen) = with_recorder(Point::BeforeTranslation, Interest::tcp(SYN), None);
    for (side, mut f) in traffic(&mut e) {
        assert!(matches!(run(&mut e, &mut f, side, 2 * SEC), Verdict::Forward(_)));
    }
    let seen = seen.lock().unwrap().clone();
    // The SYN (before translation: the subscriber's own address) and the
    // SYN-ACK; no ACK, no UDP.
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0], (Side::Inside, SYN, u32_of(SUB)));
    assert_eq!(seen[1].0, Side::Outside);
    assert_eq!(seen[1].1 & SYN, SYN);
}

#[test]
fn after_translation_a_function_sees_the_leaving_addresses() {
    let (mut e, seen) = with_recorder(Point::AfterTranslation, Interest::tcp(SYN), None);
    let mut syn = tcp_frame(Side::Inside, SUB, 40000, SERVER, 80, 64, TcpKind::Syn, 1, 0, b"");
    assert_eq!(run(&mut e, &mut syn, Side::Inside, SEC), Verdict::Forward(Side::Outside));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, Side::Outside, "the side it leaves by");
    assert!(in_pool(e.config(), addr_of(seen[0].2)), "the pool address it leaves with");
}

#[test]
fn a_drop_is_counted_under_its_reason_and_nothing_leaves() {
    let (mut e, _) = with_recorder(Point::BeforeTranslation, Interest::tcp(SYN), Some(25));
    let mut syn = tcp_frame(Side::Inside, SUB, 40001, SERVER, 25, 64, TcpKind::Syn, 1, 0, b"");
    assert_eq!(run(&mut e, &mut syn, Side::Inside, SEC), Verdict::Drop(DropReason::Filtered));
    assert_eq!(e.stats().drops.get(DropReason::Filtered), 1);
    assert_eq!(e.tables().mapping_count(), 0, "a frame dropped before translation makes no mapping");
}

#[test]
fn the_batch_path_asks_the_same_frames_and_translates_the_same() {
    let (mut one, seen_one) = with_recorder(Point::BeforeTranslation, Interest::tcp(SYN), None);
    let (mut batched, seen_batched) = with_recorder(Point::BeforeTranslation, Interest::tcp(SYN), None);
    let frames = traffic(&mut one);
    let again = traffic(&mut batched);
    assert_eq!(frames, again);
    let mut singles = Vec::new();
    for (side, f) in &frames {
        let mut f = f.clone();
        singles.push((run(&mut one, &mut f, *side, 2 * SEC), f));
    }
    for side in [Side::Outside, Side::Inside] {
        let mut fs: Vec<Vec<u8>> = frames.iter().filter(|(s, _)| *s == side).map(|(_, f)| f.clone()).collect();
        let mut verdicts = vec![Verdict::Held; fs.len()];
        batched.process_batch(&mut fs, side, 2 * SEC, &mut verdicts);
        let expected: Vec<_> = frames.iter().zip(&singles).filter(|((s, _), _)| *s == side).map(|(_, r)| r.clone()).collect();
        assert_eq!(verdicts.into_iter().zip(fs).collect::<Vec<_>>(), expected, "{side:?}");
    }
    assert_eq!(*seen_one.lock().unwrap(), *seen_batched.lock().unwrap());
}

#[test]
fn with_no_function_frames_take_the_translation_they_always_did() {
    let mut plain = engine(config());
    let (mut hooked, _) = with_recorder(Point::BeforeTranslation, Interest::tcp(SYN), None);
    let a = traffic(&mut plain);
    let b = traffic(&mut hooked);
    for ((side, mut x), (_, mut y)) in a.into_iter().zip(b) {
        assert_eq!(run(&mut plain, &mut x, side, 2 * SEC), run(&mut hooked, &mut y, side, 2 * SEC));
        assert_eq!(x, y);
    }
}
