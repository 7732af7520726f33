//! TCP session tracking (RFC 5382, RFC 7857 section 2).
//!
//! The state is a set of observed events, not a full TCP state machine: a NAT
//! sees neither side's windows, only flags. Deviations kept on purpose:
//! - established means a SYN was seen in both directions (covers simultaneous
//!   open, RFC 5382 section 2.1);
//! - a RST does not delete the session but moves it to the transitory timeout
//!   (RFC 7857 section 2.2), so a spoofed RST cannot tear down a mapping;
//! - a connection that goes on after a RST, segments without RST in both
//!   directions since the last one, gets back the state it had before (an
//!   established one its timeout): the RST was one its receiver ignored
//!   (out of window, RFC 5961), and an idle connection an off-path RST moved
//!   to four minutes would otherwise be cut;
//! - a session closed by FIN both ways or by RST may be reused by a new SYN
//!   (TIME_WAIT assassination, as hosts allow it).
//!
//! ```text
//!   (none) --SYN out--> SYN_OUT --SYN in--> ESTABLISHED --FIN out+in--> CLOSED
//!   (none) --SYN in---> SYN_IN  --SYN out-/        |                       |
//!     any state --RST--> CLOSED (transitory)       '--RST--> CLOSED        |
//!   CLOSED --SYN--> restarts as SYN_OUT/SYN_IN <-----------------------------'
//!   CLOSED by RST --no RST out+in--> the state before the RST
//! ```

use super::{Direction, TimeoutClass, TimeoutSpec};
use natrix_wire::tcp::flags;

/// RFC 5382 REQ-5: established connections idle out after at least 2 hours
/// 4 minutes; partially open or closing ones after at least 4 minutes.
pub const ESTABLISHED: TimeoutSpec = TimeoutSpec { class: TimeoutClass::TcpEstablished, key: "tcp_established", default_s: 7440, min_s: 7440, source: "RFC 5382 REQ-5" };
pub const TRANSITORY: TimeoutSpec = TimeoutSpec { class: TimeoutClass::TcpTransitory, key: "tcp_transitory", default_s: 240, min_s: 240, source: "RFC 5382 REQ-5" };

pub const SYN_OUT: u8 = 0x01;
pub const SYN_IN: u8 = 0x02;
pub const FIN_OUT: u8 = 0x04;
pub const FIN_IN: u8 = 0x08;
pub const RST: u8 = 0x10;
/// After a RST: a segment without RST went out / came in.
const ON_OUT: u8 = 0x20;
const ON_IN: u8 = 0x40;

/// Whether a segment with these flags can change a session in `state`:
/// one without SYN, FIN or RST (a plain ACK, the bulk of any connection)
/// leaves it, and so its class, as it was, unless a RST came before (the
/// connection may be going on). One test for both: the flags' and the
/// state's bits do not overlap.
#[inline(always)]
pub fn acts_on(tcp_flags: u8, state: u8) -> bool {
    (tcp_flags & (flags::SYN | flags::FIN | flags::RST)) | (state & RST) != 0
}

/// A session opened by a segment going `dir`.
pub fn open(dir: Direction, tcp_flags: u8) -> (u8, TimeoutClass) {
    let mut state = 0;
    let class = on_segment(&mut state, dir, tcp_flags);
    (state, class)
}

/// Applies one segment's flags to the session state; returns the class it gives.
pub fn on_segment(state: &mut u8, dir: Direction, tcp_flags: u8) -> TimeoutClass {
    apply(state, dir, tcp_flags);
    timeout_class(*state)
}

fn apply(state: &mut u8, dir: Direction, tcp_flags: u8) {
    if tcp_flags & flags::SYN != 0 && tcp_flags & flags::ACK == 0 && is_closed(*state) {
        *state = 0;
    }
    if tcp_flags & flags::RST != 0 {
        *state = (*state | RST) & !(ON_OUT | ON_IN);
        return;
    }
    let (syn, fin, on) = match dir {
        Direction::Out => (SYN_OUT, FIN_OUT, ON_OUT),
        Direction::In => (SYN_IN, FIN_IN, ON_IN),
    };
    if *state & RST != 0 {
        *state |= on;
        if *state & (ON_OUT | ON_IN) == ON_OUT | ON_IN {
            *state &= !(RST | ON_OUT | ON_IN);
        }
    }
    if tcp_flags & flags::SYN != 0 {
        *state |= syn;
    }
    if tcp_flags & flags::FIN != 0 {
        *state |= fin;
    }
}

pub fn is_established(state: u8) -> bool {
    state & (SYN_OUT | SYN_IN) == SYN_OUT | SYN_IN
}

/// Closed by an observed FIN exchange or a RST: the port may skip hold-down.
pub fn is_closed(state: u8) -> bool {
    state & RST != 0 || state & (FIN_OUT | FIN_IN) == FIN_OUT | FIN_IN
}

pub fn timeout_class(state: u8) -> TimeoutClass {
    if is_established(state) && !is_closed(state) {
        TimeoutClass::TcpEstablished
    } else {
        TimeoutClass::TcpTransitory
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_without_syn_fin_or_rst_changes_no_session_without_a_rst() {
        for state in 0..u8::MAX {
            for dir in [Direction::Out, Direction::In] {
                for tcp_flags in 0..=u8::MAX {
                    let mut s = state;
                    on_segment(&mut s, dir, tcp_flags);
                    if !acts_on(tcp_flags, state) {
                        assert_eq!(s, state, "state {state:#x} flags {tcp_flags:#x}");
                    }
                }
            }
        }
        let established = SYN_OUT | SYN_IN;
        assert!(!acts_on(flags::ACK | flags::PSH, established));
        assert!(acts_on(flags::ACK | flags::PSH, established | RST));
        assert!(acts_on(flags::SYN | flags::ACK, established) && acts_on(flags::FIN, established) && acts_on(flags::RST, established));
    }

    #[test]
    fn three_way_handshake_establishes() {
        let mut s = 0;
        on_segment(&mut s, Direction::Out, flags::SYN);
        assert_eq!(timeout_class(s), TimeoutClass::TcpTransitory);
        on_segment(&mut s, Direction::In, flags::SYN | flags::ACK);
        on_segment(&mut s, Direction::Out, flags::ACK);
        assert_eq!(timeout_class(s), TimeoutClass::TcpEstablished);
    }

    #[test]
    fn simultaneous_open_establishes() {
        let mut s = 0;
        on_segment(&mut s, Direction::Out, flags::SYN);
        on_segment(&mut s, Direction::In, flags::SYN);
        assert!(is_established(s));
    }

    #[test]
    fn fin_both_ways_closes_one_fin_does_not() {
        let mut s = SYN_OUT | SYN_IN;
        on_segment(&mut s, Direction::Out, flags::FIN | flags::ACK);
        assert!(!is_closed(s));
        assert_eq!(timeout_class(s), TimeoutClass::TcpEstablished);
        on_segment(&mut s, Direction::In, flags::FIN | flags::ACK);
        assert!(is_closed(s));
        assert_eq!(timeout_class(s), TimeoutClass::TcpTransitory);
    }

    #[test]
    fn rst_moves_to_transitory_and_a_new_syn_restarts() {
        let mut s = SYN_OUT | SYN_IN;
        on_segment(&mut s, Direction::In, flags::RST);
        assert!(is_closed(s));
        assert_eq!(timeout_class(s), TimeoutClass::TcpTransitory);
        on_segment(&mut s, Direction::Out, flags::SYN);
        assert_eq!(s, SYN_OUT);
    }

    #[test]
    fn a_connection_going_on_both_ways_after_a_rst_is_established_again() {
        let mut s = SYN_OUT | SYN_IN;
        on_segment(&mut s, Direction::In, flags::RST);
        assert_eq!(on_segment(&mut s, Direction::Out, flags::ACK), TimeoutClass::TcpTransitory, "one way is not enough");
        assert_eq!(on_segment(&mut s, Direction::Out, flags::ACK | flags::PSH), TimeoutClass::TcpTransitory);
        assert_eq!(on_segment(&mut s, Direction::In, flags::ACK), TimeoutClass::TcpEstablished);
        assert_eq!(s, SYN_OUT | SYN_IN);
    }

    #[test]
    fn a_rst_answering_the_other_side_keeps_a_reset_connection_closed() {
        // The host that sent the RST answers the peer's segments still in
        // flight with more RSTs, never with a segment without one.
        let mut s = SYN_OUT | SYN_IN;
        on_segment(&mut s, Direction::Out, flags::RST);
        for _ in 0..3 {
            assert_eq!(on_segment(&mut s, Direction::In, flags::ACK | flags::PSH), TimeoutClass::TcpTransitory);
            assert_eq!(on_segment(&mut s, Direction::Out, flags::RST), TimeoutClass::TcpTransitory);
        }
        assert!(is_closed(s));
    }

    #[test]
    fn only_segments_after_the_last_rst_count() {
        // A spoofed RST, the host's challenge ACK, then the host aborting:
        // the peer's data in flight must not restore what the abort ended.
        let mut s = SYN_OUT | SYN_IN;
        on_segment(&mut s, Direction::In, flags::RST);
        on_segment(&mut s, Direction::Out, flags::ACK);
        on_segment(&mut s, Direction::Out, flags::RST);
        assert_eq!(on_segment(&mut s, Direction::In, flags::ACK | flags::PSH), TimeoutClass::TcpTransitory);
        assert!(is_closed(s));
    }

    #[test]
    fn a_half_open_connection_is_not_established_by_segments_after_a_rst() {
        let mut s = 0;
        on_segment(&mut s, Direction::Out, flags::SYN);
        on_segment(&mut s, Direction::In, flags::RST);
        on_segment(&mut s, Direction::Out, flags::ACK);
        assert_eq!(on_segment(&mut s, Direction::In, flags::ACK), TimeoutClass::TcpTransitory);
        assert_eq!(s, SYN_OUT);
    }

    #[test]
    fn fin_both_ways_stays_closed_after_a_rst_and_later_acks() {
        let mut s = SYN_OUT | SYN_IN | FIN_OUT | FIN_IN;
        on_segment(&mut s, Direction::In, flags::RST);
        on_segment(&mut s, Direction::Out, flags::ACK);
        assert_eq!(on_segment(&mut s, Direction::In, flags::ACK), TimeoutClass::TcpTransitory);
        assert!(is_closed(s));
    }
}
