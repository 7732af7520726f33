//! The session sync window, as conntrackd's FTFW keeps one: the active
//! node batches records into numbered messages, keeps each until the
//! standby acknowledges it and retransmits it when no acknowledgement comes
//! in time; the standby takes messages in order only and acknowledges the
//! last one it took. Memory is bounded on both sides: the sender holds at
//! most `max_pending` messages and gives up the oldest (counting its
//! records lost) rather than wait, and the receiver holds nothing but
//! counters. Time comes in with each call; nothing here does I/O.

use std::collections::VecDeque;

use super::wire::{Message, Record, MAX_RECORDS};

/// The window's settings (`[cluster] sync_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Messages sent and not yet acknowledged, at most.
    pub max_pending: usize,
    /// A message unacknowledged this long is sent again.
    pub retransmit_ns: u64,
    /// Sent this many times as the oldest message held without
    /// acknowledgement, a message is given up. Only the oldest counts its
    /// tries: the receiver takes messages in order, so those behind it
    /// cannot be acknowledged before it, and must not run out with it.
    pub max_tries: u32,
    /// A partly filled batch waits at most this long for more records.
    pub flush_ns: u64,
    /// With nothing else to send this long, the active node sends ALIVE.
    pub keepalive_ns: u64,
}

/// Whether sequence `a` comes before `b`, across wrap-around (RFC 1982).
fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

struct Pending {
    sequence: u32,
    before: u32,
    records: Vec<Record>,
    sent_ns: u64,
    /// Times sent.
    sends: u32,
}

/// What the sending side has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Records handed to the window.
    pub records_queued: u64,
    /// Records sent at least once.
    pub records_sent: u64,
    pub records_acked: u64,
    /// Records given up (the window was full, or the standby never
    /// acknowledged them). An upper bound: a message whose acknowledgement
    /// alone was lost did arrive; the receiver's count is exact.
    pub records_given_up: u64,
    pub messages_sent: u64,
    pub retransmits: u64,
    /// Acknowledgements of another session (a restarted sender's past).
    pub acks_stale: u64,
}

pub struct Sender {
    session: u32,
    limits: Limits,
    next_sequence: u32,
    /// Records of this session before the batch being filled.
    records_before: u32,
    batch: Vec<Record>,
    batch_since_ns: u64,
    /// Sealed messages not yet acknowledged, in sequence order.
    pending: VecDeque<Pending>,
    /// Times the oldest pending message was sent while the oldest.
    front_tries: u32,
    /// When anything was last sent.
    sent_ns: u64,
    stats: SenderStats,
}

impl Sender {
    /// `session` must differ from the one this node used before a restart
    /// and come after it (the start time in milliseconds does).
    pub fn new(session: u32, limits: Limits) -> Sender {
        Sender {
            session,
            limits,
            next_sequence: 0,
            records_before: 0,
            batch: Vec::with_capacity(MAX_RECORDS),
            batch_since_ns: 0,
            pending: VecDeque::with_capacity(limits.max_pending),
            front_tries: 0,
            sent_ns: 0,
            stats: SenderStats::default(),
        }
    }

    pub fn push(&mut self, r: Record, now_ns: u64) {
        if self.batch.is_empty() {
            self.batch_since_ns = now_ns;
        }
        self.batch.push(r);
        self.stats.records_queued += 1;
        if self.batch.len() == MAX_RECORDS {
            self.seal();
        }
    }

    fn seal(&mut self) {
        if self.pending.len() >= self.limits.max_pending.max(1) {
            self.give_up_oldest();
        }
        let records = std::mem::replace(&mut self.batch, Vec::with_capacity(MAX_RECORDS));
        let n = records.len() as u32;
        self.pending.push_back(Pending { sequence: self.next_sequence, before: self.records_before, records, sent_ns: 0, sends: 0 });
        self.next_sequence = self.next_sequence.wrapping_add(1);
        self.records_before = self.records_before.wrapping_add(n);
    }

    fn give_up_oldest(&mut self) {
        if let Some(p) = self.pending.pop_front() {
            self.stats.records_given_up += p.records.len() as u64;
            self.front_tries = 0;
        }
    }

    /// The oldest message still held: messages before it were acknowledged or given up.
    fn base(&self) -> u32 {
        self.pending.front().map_or(self.next_sequence, |p| p.sequence)
    }

    /// Sends what is due at `now_ns`: a batch that waited `flush_ns`, new
    /// messages, and messages unacknowledged for `retransmit_ns` (those
    /// sent `max_tries` times are given up instead); ALIVE when nothing was
    /// sent for `keepalive_ns`.
    pub fn transmit(&mut self, now_ns: u64, mut send: impl FnMut(&[u8])) {
        if !self.batch.is_empty() && now_ns.saturating_sub(self.batch_since_ns) >= self.limits.flush_ns {
            self.seal();
        }
        while self.front_tries >= self.limits.max_tries.max(1) && self.pending.front().is_some_and(|p| now_ns.saturating_sub(p.sent_ns) >= self.limits.retransmit_ns) {
            self.give_up_oldest();
        }
        let base = self.base();
        for (i, p) in self.pending.iter_mut().enumerate() {
            let due = p.sends == 0 || now_ns.saturating_sub(p.sent_ns) >= self.limits.retransmit_ns;
            if !due {
                continue;
            }
            if i == 0 {
                self.front_tries += 1;
            }
            if p.sends == 0 {
                self.stats.records_sent += p.records.len() as u64;
            } else {
                self.stats.retransmits += 1;
            }
            p.sends += 1;
            p.sent_ns = now_ns;
            self.stats.messages_sent += 1;
            let m = Message::Data { session: self.session, sequence: p.sequence, base, before: p.before, records: p.records.clone() };
            send(&m.encode());
            self.sent_ns = now_ns;
        }
        if now_ns.saturating_sub(self.sent_ns) >= self.limits.keepalive_ns {
            send(&Message::Alive { session: self.session, next: self.next_sequence, base, before: self.records_before }.encode());
            self.sent_ns = now_ns;
        }
    }

    /// The standby took every message up to `ack` of `session`.
    pub fn on_ack(&mut self, session: u32, ack: u32) {
        if session != self.session {
            self.stats.acks_stale += 1;
            return;
        }
        while let Some(p) = self.pending.front().filter(|p| !before(ack, p.sequence)) {
            self.stats.records_acked += p.records.len() as u64;
            self.pending.pop_front();
            self.front_tries = 0;
        }
    }

    /// Records handed over and not yet acknowledged or given up: the sync lag.
    pub fn unacknowledged(&self) -> usize {
        self.batch.len() + self.pending.iter().map(|p| p.records.len()).sum::<usize>()
    }

    pub fn session(&self) -> u32 {
        self.session
    }

    pub fn pending_messages(&self) -> usize {
        self.pending.len()
    }

    pub fn stats(&self) -> SenderStats {
        self.stats
    }
}

/// What the receiving side has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Records taken, in order.
    pub records_received: u64,
    /// Records the active node sent and this node never got: exact, from
    /// the count each message carries of the records before it.
    pub records_lost: u64,
    pub duplicates: u64,
    /// Messages ahead of the next expected one, dropped for the sender to resend.
    pub out_of_order: u64,
    /// Messages of an earlier session of the sender.
    pub stale: u64,
}

/// The standby's side of the window.
#[derive(Default)]
pub struct Receiver {
    /// The sender's session and the next sequence expected of it.
    peer: Option<(u32, u32)>,
    /// Records of the session accounted for (taken or counted lost).
    records_seen: u32,
    /// A session first heard, whose state before this node heard it is to be asked for.
    new_session: Option<u32>,
    /// The sender's sessions this node followed before its current one,
    /// latest last: a late message of one of those is stale. Session ids
    /// are milliseconds on the sender's clock, which a comparison would
    /// take for earlier once a session ran 24.8 days.
    retired: std::collections::VecDeque<u32>,
    stats: ReceiverStats,
}

/// How many of the sender's earlier sessions `Receiver::retired` keeps.
const RETIRED_SESSIONS: usize = 4;

impl Receiver {
    pub fn new() -> Receiver {
        Receiver::default()
    }

    /// Takes a DATA message: the records to install, in order (empty for a
    /// duplicate, an early or a stale message), and the acknowledgement to
    /// send back (none for a stale message).
    pub fn on_data<'a>(&mut self, session: u32, sequence: u32, base: u32, records_before: u32, records: &'a [Record]) -> (&'a [Record], Option<Message>) {
        let Some(expected) = self.expected(session, base) else { return (&[], None) };
        let taken: &[Record] = if sequence == expected {
            self.stats.records_lost += u64::from(records_before.wrapping_sub(self.records_seen));
            self.stats.records_received += records.len() as u64;
            self.records_seen = records_before.wrapping_add(records.len() as u32);
            records
        } else {
            if before(sequence, expected) {
                self.stats.duplicates += 1;
            } else {
                self.stats.out_of_order += 1;
            }
            &[]
        };
        let next = if sequence == expected { expected.wrapping_add(1) } else { expected };
        self.peer = Some((session, next));
        (taken, Some(Message::Ack { session, ack: next.wrapping_sub(1) }))
    }

    /// Takes an ALIVE: when the sender holds nothing (`base` is `next`),
    /// every record before `next` was either taken here or is lost.
    pub fn on_alive(&mut self, session: u32, next: u32, base: u32, records_before: u32) {
        let Some(expected) = self.expected(session, base) else { return };
        if before(records_before, self.records_seen) {
            // An ALIVE that a later DATA overtook on the way: old news.
            return;
        }
        if base == next {
            self.stats.records_lost += u64::from(records_before.wrapping_sub(self.records_seen));
            self.records_seen = records_before;
            self.peer = Some((session, next));
        } else {
            self.peer = Some((session, expected));
        }
    }

    /// The next sequence expected of `session`, whose oldest held message
    /// is `base`; None for a message of an earlier session (counted stale).
    fn expected(&mut self, session: u32, base: u32) -> Option<u32> {
        let expected = match self.peer {
            Some((s, e)) if s == session => e,
            _ if self.retired.contains(&session) => {
                self.stats.stale += 1;
                return None;
            }
            // A sender's new life: everything before this message of it is unknown here.
            current => {
                if let Some((s, _)) = current {
                    if self.retired.len() == RETIRED_SESSIONS {
                        self.retired.pop_front();
                    }
                    self.retired.push_back(s);
                }
                self.records_seen = 0;
                self.new_session = Some(session);
                base
            }
        };
        // Messages before `base` were given up by the sender.
        Some(if before(expected, base) { base } else { expected })
    }

    /// A session heard for the first time since the last call: the
    /// standby asks it for a resync (RESYNC), since it missed what that
    /// sender made before.
    pub fn take_new_session(&mut self) -> Option<u32> {
        self.new_session.take()
    }

    pub fn stats(&self) -> ReceiverStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::sync::wire::tests::record;
    use proptest::prelude::*;

    const LIMITS: Limits = Limits { max_pending: 8, retransmit_ns: 10, max_tries: 3, flush_ns: 5, keepalive_ns: 1000 };

    fn data(bytes: &[u8]) -> (u32, u32, u32, u32, Vec<Record>) {
        match Message::decode(bytes).unwrap() {
            Message::Data { session, sequence, base, before, records } => (session, sequence, base, before, records),
            m => panic!("expected DATA, got {m:?}"),
        }
    }

    fn rec(n: u16) -> Record {
        use crate::cluster::sync::wire::RecordKind;
        Record { kind: RecordKind::MappingCreated, proto: natrix_engine::Proto::Udp, int_addr: 1, int_port: n, ext_addr: 2, ext_port: n, ext_port_end: n, rem_addr: 0, rem_port: 0 }
    }

    #[test]
    fn a_full_batch_leaves_at_once_and_a_partial_one_after_flush() {
        let mut s = Sender::new(1, LIMITS);
        for i in 0..MAX_RECORDS as u16 + 1 {
            s.push(rec(i), 0);
        }
        let mut out = Vec::new();
        s.transmit(0, |b| out.push(b.to_vec()));
        assert_eq!(out.len(), 1);
        assert_eq!(data(&out[0]).4.len(), MAX_RECORDS);
        s.transmit(5, |b| out.push(b.to_vec()));
        let (_, seq, base, before, recs) = data(&out[1]);
        assert_eq!((seq, base, before, recs.len()), (1, 0, MAX_RECORDS as u32, 1));
    }

    #[test]
    fn unacknowledged_messages_are_resent_then_given_up_and_the_receiver_counts_them() {
        let mut s = Sender::new(1, LIMITS);
        let mut r = Receiver::new();
        s.push(rec(1), 0);
        let mut lost = Vec::new();
        for t in [5, 15, 25, 35] {
            s.transmit(t, |b| lost.push(b.to_vec()));
        }
        assert_eq!(lost.len(), 3, "sent max_tries times");
        assert_eq!(s.stats().retransmits, 2);
        assert_eq!(s.stats().records_given_up, 1);
        s.push(rec(2), 40);
        let mut out = Vec::new();
        s.transmit(45, |b| out.push(b.to_vec()));
        let (session, seq, base, before, recs) = data(&out[0]);
        assert_eq!((seq, base, before), (1, 1, 1));
        let (taken, ack) = r.on_data(session, seq, base, before, &recs);
        assert_eq!(taken, &[rec(2)]);
        assert_eq!(r.stats().records_lost, 1);
        assert_eq!(ack, Some(Message::Ack { session: 1, ack: 1 }));
    }

    #[test]
    fn a_full_window_gives_up_its_oldest_message_instead_of_waiting() {
        let mut s = Sender::new(1, Limits { max_pending: 2, ..LIMITS });
        for i in 0..3 * MAX_RECORDS as u16 {
            s.push(rec(i), 0);
        }
        assert_eq!(s.pending_messages(), 2);
        assert_eq!(s.stats().records_given_up, MAX_RECORDS as u64);
    }

    #[test]
    fn a_restarted_sender_is_followed_and_its_past_ignored() {
        let mut r = Receiver::new();
        let recs = [rec(1)];
        assert_eq!(r.on_data(100, 0, 0, 0, &recs).0.len(), 1);
        assert_eq!((r.take_new_session(), r.take_new_session()), (Some(100), None));
        let (t, ack) = r.on_data(200, 0, 0, 0, &recs);
        assert_eq!(r.take_new_session(), Some(200));
        assert_eq!((t.len(), ack), (1, Some(Message::Ack { session: 200, ack: 0 })));
        let (t, ack) = r.on_data(100, 1, 0, 1, &recs);
        assert_eq!((t.len(), ack, r.stats().stale), (0, None, 1));
    }

    /// An ALIVE overtaken on the way by a later DATA tells nothing new:
    /// no record counts as lost for it.
    #[test]
    fn an_alive_that_arrives_late_counts_nothing_lost() {
        let mut r = Receiver::new();
        let recs = [rec(1), rec(2)];
        assert_eq!(r.on_data(7, 0, 0, 0, &recs).0.len(), 2);
        r.on_alive(7, 0, 0, 0);
        assert_eq!(r.stats().records_lost, 0);
        r.on_alive(7, 1, 1, 2);
        assert_eq!(r.stats().records_lost, 0, "all taken");
    }

    /// Session ids are the sender's milliseconds: one that ran 25 days
    /// (past 2^31 ms) and restarted has an id a wrapping comparison takes
    /// for earlier. Its new life is followed all the same.
    #[test]
    fn a_sender_restarted_after_25_days_is_followed() {
        let mut r = Receiver::new();
        let recs = [rec(1)];
        let first = 1_000u32;
        assert_eq!(r.on_data(first, 0, 0, 0, &recs).0.len(), 1);
        let later = first.wrapping_add(25 * 86_400_000);
        assert!(before(later, first), "the comparison that misled");
        let (t, ack) = r.on_data(later, 0, 0, 0, &recs);
        assert_eq!((t.len(), ack, r.stats().stale), (1, Some(Message::Ack { session: later, ack: 0 }), 0));
        assert_eq!(r.on_data(first, 1, 0, 1, &recs).0.len(), 0, "the old life's late message is stale");
    }

    #[test]
    fn alive_tells_the_receiver_of_losses_at_the_end_of_a_burst() {
        let mut s = Sender::new(1, LIMITS);
        let mut r = Receiver::new();
        s.push(rec(1), 0);
        for t in [5, 15, 25, 35] {
            s.transmit(t, |_| {}); // every try lost
        }
        let mut out = Vec::new();
        s.transmit(1035, |b| out.push(b.to_vec()));
        assert_eq!(Message::decode(&out[0]), Ok(Message::Alive { session: 1, next: 1, base: 1, before: 1 }));
        r.on_alive(1, 1, 1, 1);
        assert_eq!(r.stats().records_lost, 1);
    }

    #[test]
    fn sequences_wrap_around() {
        assert!(before(u32::MAX, 0));
        assert!(!before(0, u32::MAX));
        let mut r = Receiver::new();
        assert_eq!(r.on_data(1, u32::MAX, u32::MAX, 0, &[rec(1)]).0.len(), 1);
        assert_eq!(r.on_data(1, 0, u32::MAX, 1, &[rec(2)]).1, Some(Message::Ack { session: 1, ack: 0 }));
        assert_eq!(r.stats().records_lost, 0);
    }

    /// One datagram in flight: which way, when it lands, its bytes.
    struct Flight {
        to_receiver: bool,
        at: u64,
        bytes: Vec<u8>,
    }

    proptest! {
        /// Over a channel that drops, duplicates and reorders, the standby
        /// takes the records in the order they were pushed, each at most
        /// once, and what it takes plus what it counts lost is exactly what
        /// was pushed; the sender never holds more than `max_pending`
        /// messages.
        #[test]
        fn lossy_channels_deliver_in_order_or_count_the_loss_exactly(
            records in proptest::collection::vec(record(), 1..600),
            gaps in proptest::collection::vec(0u64..4, 600),
            fate in proptest::collection::vec((0u8..100, 0u64..30), 4000),
            max_pending in 1usize..12,
        ) {
            let limits = Limits { max_pending, retransmit_ns: 20, max_tries: 4, flush_ns: 3, keepalive_ns: 50 };
            let mut s = Sender::new(7, limits);
            let mut r = Receiver::new();
            let mut taken: Vec<Record> = Vec::new();
            let mut flights: Vec<Flight> = Vec::new();
            let mut fates = fate.into_iter().cycle();
            let mut now = 0u64;
            let mut next = records.iter().zip(gaps.iter().cycle());
            let mut pushed = 0usize;
            // The clean phase's one record: its message tells the receiver
            // of every loss before it.
            let sentinel = Record { int_port: 1, ..rec(0) };
            let mut sentinel_pushed = false;
            // Lossy phase while records are pushed, then a clean phase that drains.
            for step in 0..20_000u64 {
                now += 1;
                let lossy = pushed < records.len();
                if let Some((rec, gap)) = if step % 2 == 0 { next.next() } else { None } {
                    s.push(*rec, now);
                    pushed += 1;
                    now += gap;
                } else if !lossy && !sentinel_pushed {
                    s.push(sentinel, now);
                    sentinel_pushed = true;
                }
                let mut out = Vec::new();
                s.transmit(now, |b| out.push(b.to_vec()));
                for bytes in out {
                    let (p, delay) = fates.next().unwrap();
                    match p {
                        _ if !lossy => flights.push(Flight { to_receiver: true, at: now + 1, bytes }),
                        0..=19 => {}
                        20..=29 => {
                            flights.push(Flight { to_receiver: true, at: now + delay, bytes: bytes.clone() });
                            flights.push(Flight { to_receiver: true, at: now + delay + 1, bytes });
                        }
                        _ => flights.push(Flight { to_receiver: true, at: now + delay, bytes }),
                    }
                }
                let (due, later): (Vec<Flight>, Vec<Flight>) = flights.into_iter().partition(|f| f.at <= now);
                flights = later;
                for f in due {
                    match Message::decode(&f.bytes).unwrap() {
                        Message::Data { session, sequence, base, before, records } => {
                            prop_assert!(f.to_receiver);
                            let (t, ack) = r.on_data(session, sequence, base, before, &records);
                            taken.extend_from_slice(t);
                            if let Some(ack) = ack {
                                let (p, delay) = fates.next().unwrap();
                                if !lossy || p >= 20 {
                                    flights.push(Flight { to_receiver: false, at: now + if lossy { delay } else { 1 }, bytes: ack.encode() });
                                }
                            }
                        }
                        Message::Ack { session, ack } => s.on_ack(session, ack),
                        Message::Alive { session, next, base, before } => r.on_alive(session, next, base, before),
                        Message::Resync { .. } => prop_assert!(false, "the window never sends RESYNC"),
                    }
                }
                prop_assert!(s.pending_messages() <= max_pending);
                if sentinel_pushed && s.unacknowledged() == 0 && flights.is_empty() {
                    break;
                }
            }
            prop_assert_eq!(s.unacknowledged(), 0, "drained");
            prop_assert_eq!(taken.pop(), Some(sentinel));
            // What was taken is the pushed sequence with some records left out, in order.
            let mut it = records.iter();
            for t in &taken {
                prop_assert!(it.any(|r| r == t), "taken out of order or twice");
            }
            let st = r.stats();
            prop_assert_eq!(st.records_received as usize, taken.len() + 1);
            prop_assert_eq!(st.records_received + st.records_lost, records.len() as u64 + 1, "the receiver's count of lost records is exact");
            let sent = s.stats();
            prop_assert_eq!(sent.records_acked + sent.records_given_up, records.len() as u64 + 1);
            prop_assert!(st.records_lost <= sent.records_given_up);
        }
    }
}
