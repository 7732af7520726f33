//! SCTP association tracking as seed 001 (section 2.3) and
//! draft-ietf-tsvwg-natsupp describe it: the NAT learns an association's
//! two verification tags from its INIT and INIT-ACK, and ends it when it
//! forwards an ABORT or a SHUTDOWN-COMPLETE. Its state is what the chunks
//! examined (at most `[sctp] max_chunks` of them) said:
//!
//! ```text
//!   (none) --INIT out---------------------> INIT_SENT   (sctp_init)
//!   (none) --ASCONF with VTags out--------> UP          (sctp)
//!   INIT_SENT --INIT-ACK in---------------> UP          (sctp)
//!   UP --SHUTDOWN-ACK either way----------> SHUTTING_DOWN (sctp_init)
//!   any --ABORT or SHUTDOWN-COMPLETE------> (gone, once forwarded)
//! ```
//!
//! Deviations kept on purpose:
//! - a shutting-down association idles out after `sctp_init`: alias_sctp's
//!   shutdown timer has the init timer's length (15 s), and natrix keeps
//!   the two timeout keys CONTRACTS fixes rather than adding a third;
//! - an ABORT ends the association whoever sent it, a middlebox (M bit)
//!   included: the endpoint that receives it tears the association down;
//! - a packet whose state-changing chunk lies past `max_chunks` changes
//!   nothing (seed 001 section 3.1.3 accepts missing such a change): the
//!   association then idles out.

use super::{TimeoutClass, TimeoutSpec};

/// An INIT forwarded, no INIT-ACK yet: alias_sctp's init timer. A lost
/// entry costs little: the INIT's retransmission opens it again.
pub const INIT: TimeoutSpec = TimeoutSpec { class: TimeoutClass::SctpInit, key: "sctp_init", default_s: 15, min_s: 1, source: "seed 001 (alias_sctp's init timer)" };
/// An established association with no packet: alias_sctp's up timer. An
/// idle association still sends a HEARTBEAT every HB.interval (30 s) plus an
/// RTO of at most RTO.Max (60 s) (RFC 9260 sections 8.3 and 16); less than
/// that loses idle associations.
pub const UP: TimeoutSpec = TimeoutSpec { class: TimeoutClass::Sctp, key: "sctp", default_s: 300, min_s: 90, source: "RFC 9260 sections 8.3 and 16 (heartbeat interval)" };

pub const INIT_SENT: u8 = 1;
pub const ESTABLISHED: u8 = 2;
pub const SHUTTING_DOWN: u8 = 3;

/// What the chunks of one packet said about its association.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Nothing that changes the state (DATA, SACK, HEARTBEAT, COOKIE-ECHO...).
    None,
    /// An INIT-ACK: the remote's tag is known, the association is up.
    InitAck,
    ShutdownAck,
    /// An ABORT or a SHUTDOWN-COMPLETE: the association ends once forwarded.
    End,
}

/// What becomes of an association after a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Keep(TimeoutClass),
    End,
}

/// A new association opened by an INIT.
pub fn open() -> (u8, TimeoutClass) {
    (INIT_SENT, INIT.class)
}

/// A new association opened by an ASCONF carrying both tags (the NAT lost
/// or never had the INIT, draft-ietf-tsvwg-natsupp "Handling of Missing
/// State"): it is up already.
pub fn open_established() -> (u8, TimeoutClass) {
    (ESTABLISHED, UP.class)
}

/// Applies one packet's signal to the state.
pub fn on_packet(state: &mut u8, signal: Signal) -> Next {
    match (signal, *state) {
        (Signal::End, _) => return Next::End,
        (Signal::InitAck, INIT_SENT) => *state = ESTABLISHED,
        (Signal::ShutdownAck, ESTABLISHED) => *state = SHUTTING_DOWN,
        _ => {}
    }
    Next::Keep(timeout_class(*state))
}

pub fn timeout_class(state: u8) -> TimeoutClass {
    match state {
        ESTABLISHED => UP.class,
        _ => INIT.class,
    }
}

pub fn is_established(state: u8) -> bool {
    state == ESTABLISHED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_then_init_ack_then_shutdown_then_complete() {
        let (mut s, class) = open();
        assert_eq!(class, TimeoutClass::SctpInit);
        assert_eq!(on_packet(&mut s, Signal::None), Next::Keep(TimeoutClass::SctpInit), "COOKIE-ECHO before the INIT-ACK changes nothing");
        assert_eq!(on_packet(&mut s, Signal::InitAck), Next::Keep(TimeoutClass::Sctp));
        assert!(is_established(s));
        assert_eq!(on_packet(&mut s, Signal::InitAck), Next::Keep(TimeoutClass::Sctp), "a retransmitted INIT-ACK");
        assert_eq!(on_packet(&mut s, Signal::ShutdownAck), Next::Keep(TimeoutClass::SctpInit));
        assert_eq!(s, SHUTTING_DOWN);
        assert_eq!(on_packet(&mut s, Signal::InitAck), Next::Keep(TimeoutClass::SctpInit), "no way back up");
        assert_eq!(on_packet(&mut s, Signal::End), Next::End);
    }

    #[test]
    fn an_abort_ends_every_state_and_asconf_opens_up() {
        for (mut s, _) in [open(), open_established()] {
            assert_eq!(on_packet(&mut s, Signal::End), Next::End);
        }
        let (mut s, class) = open_established();
        assert_eq!(class, TimeoutClass::Sctp);
        assert_eq!(on_packet(&mut s, Signal::ShutdownAck), Next::Keep(TimeoutClass::SctpInit));
        let (mut s, _) = open();
        assert_eq!(on_packet(&mut s, Signal::ShutdownAck), Next::Keep(TimeoutClass::SctpInit), "a SHUTDOWN-ACK before the INIT-ACK is ignored");
        assert_eq!(s, INIT_SENT);
    }
}
