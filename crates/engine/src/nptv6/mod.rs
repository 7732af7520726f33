//! NPTv6 (RFC 6296): stateless, checksum-neutral IPv6-to-IPv6 prefix
//! translation, as a translator beside NAPT44 on the pipeline's IPv6 stage.
//!
//! - A packet arriving inside whose source lies in a binding's inside
//!   prefix leaves with the outside prefix; one arriving outside whose
//!   destination lies in a binding's outside prefix leaves with the inside
//!   prefix. Everything else is routed as it came.
//! - From inside to a site's outside prefix, both addresses are mapped and
//!   the packet goes back inside (hairpinning, RFC 6296 section 4.3); to a
//!   binding's inside prefix it goes back inside untouched, never out with
//!   a translated source and a site-local destination.
//! - The rewrite keeps the address's one's-complement sum (the adjustment
//!   word of `binding`), so no checksum is touched: TCP, UDP, ICMPv6 and
//!   anything else whose checksum covers the pseudo-header stays valid, and
//!   fragments, ESP and unknown protocols translate alike.
//! - An ICMPv6 error carries the packet it is about, which travelled the
//!   other way: its other address is mapped too (`icmp_error`), as Linux's
//!   NPT targets do.
//! - No state per flow or per packet: the table is built once from the
//!   configuration (at start and on reload), each binding's adjustment
//!   with it.

pub mod binding;
mod fast;
mod icmp_error;

pub use binding::{check_bindings, Binding, BindingProblem};

use binding::{Direction, Mapping, Unmappable};

use crate::drop::DropReason;
use crate::error::EngineError;
use crate::pipeline::frame::Ip6;
use crate::Side;
use std::net::Ipv6Addr;

/// `Nptv6::own` where natrix has no address on a side.
const NO_ADDRESS: u128 = u128::MAX;

/// Offsets of the addresses within an IPv6 header.
const SRC_AT: usize = 8;
const DST_AT: usize = 24;

/// The binding table, and what it has done.
#[derive(Debug, Default)]
pub(crate) struct Nptv6 {
    mappings: Vec<Mapping>,
    /// DS-Lite's AFTR address, when it is on: what is sent to it, and any
    /// IPv4 in IPv6, is the AFTR's to claim, so the fast path leaves it to
    /// the full path, which asks DS-Lite first.
    aftr: Option<u128>,
    /// natrix's own addresses (`address6`, inside and outside; all ones
    /// where none, which no address of natrix's nor any a binding maps to
    /// is): what is sent to them ends in the full path.
    own: [u128; 2],
    /// Frames whose addresses were translated, by the side they arrived on.
    pub translated: [u64; 2],
}

impl Nptv6 {
    /// Builds the table; refuses bindings that `check_bindings` refuses.
    pub fn new(bindings: &[Binding]) -> Result<Nptv6, EngineError> {
        check_bindings(bindings).map_err(|p| EngineError::Config { key: format!("nptv6[{}].{}", p.index, p.prefix), problem: p.problem })?;
        Ok(Nptv6 { mappings: bindings.iter().map(Mapping::new).collect(), aftr: None, own: [NO_ADDRESS; 2], translated: [0; 2] })
    }

    /// DS-Lite's AFTR address (None: DS-Lite off) and natrix's own
    /// addresses, at start and after a reload.
    pub fn set_local_addresses(&mut self, aftr: Option<Ipv6Addr>, own: [Option<Ipv6Addr>; 2]) {
        self.aftr = aftr.map(u128::from);
        self.own = own.map(|a| a.map_or(NO_ADDRESS, u128::from));
    }

    pub fn with_local_addresses(mut self, aftr: Option<Ipv6Addr>, own: [Option<Ipv6Addr>; 2]) -> Nptv6 {
        self.set_local_addresses(aftr, own);
        self
    }

    /// Whether `addr` is natrix's own address on `side`. (One to its
    /// address on the other side is routed there, where it ends.)
    pub(crate) fn is_own(&self, addr: Ipv6Addr, side: Side) -> bool {
        let a = u128::from(addr);
        a != NO_ADDRESS && a == self.own[side as usize]
    }

    /// Whether `addr` lies in a binding's inside prefix.
    pub(crate) fn covers_inside(&self, addr: Ipv6Addr) -> bool {
        self.covered(u128::from(addr), Direction::Outbound)
    }

    #[inline(always)]
    fn covered(&self, addr: u128, dir: Direction) -> bool {
        self.mappings.iter().any(|m| m.covers(addr, dir))
    }

    /// A reload: `fresh`'s table replaces this one; the counters go on.
    /// Whether no binding is configured.
    pub(crate) fn is_empty(&self) -> bool {
        self.mappings.is_empty()
    }

    pub fn replace_table(&mut self, fresh: Nptv6) {
        self.mappings = fresh.mappings;
    }

    /// Translates the IPv6 packet of `frame` in place if a binding claims
    /// it: its source when it arrived inside, its destination when outside,
    /// both when it goes from inside to a site's outside prefix. Returns
    /// the side it leaves by.
    pub fn translate(&mut self, frame: &mut [u8], ip: &Ip6, arrived: Side) -> Result<Side, DropReason> {
        if self.mappings.is_empty() {
            return Ok(arrived.other());
        }
        let (out, mapped, quoted) = match arrived {
            Side::Inside => {
                let dst = address_at(frame, ip.l3 + DST_AT);
                if self.covered(dst, Direction::Outbound) {
                    return Ok(Side::Inside);
                }
                // Both addresses judged before either is written.
                let hairpin = self.mapped(dst, Direction::Inbound)?;
                let mapped = self.map_in_place(frame, ip.l3 + SRC_AT, Direction::Outbound)?;
                let quoted = icmp_error::map_quoted(self, frame, ip, Direction::Outbound)?;
                if let Some(to) = hairpin {
                    frame[ip.l3 + DST_AT..ip.l3 + DST_AT + 16].copy_from_slice(&to.to_be_bytes());
                    icmp_error::map_quoted(self, frame, ip, Direction::Inbound)?;
                }
                (if hairpin.is_some() { Side::Inside } else { Side::Outside }, mapped || hairpin.is_some(), quoted)
            }
            Side::Outside => {
                let mapped = self.map_in_place(frame, ip.l3 + DST_AT, Direction::Inbound)?;
                (Side::Inside, mapped, icmp_error::map_quoted(self, frame, ip, Direction::Inbound)?)
            }
        };
        // Sent from outside to the image of natrix's own inside address.
        if out == Side::Inside && self.is_own(Ipv6Addr::from(address_at(frame, ip.l3 + DST_AT)), Side::Inside) {
            return Err(DropReason::LocalDestination);
        }
        if mapped || quoted {
            self.translated[arrived as usize] += 1;
        }
        Ok(out)
    }

    /// `addr` mapped in `dir` by the binding that covers it, if one does.
    fn mapped(&self, addr: u128, dir: Direction) -> Result<Option<u128>, DropReason> {
        match self.mappings.iter().find(|m| m.covers(addr, dir)) {
            None => Ok(None),
            Some(m) => m.map(addr, dir).map(Some).map_err(|Unmappable| DropReason::Nptv6Unmappable),
        }
    }

    /// Maps the address at `frame[at..at + 16]` if a binding covers it in
    /// `dir`; true when one did.
    #[inline(always)]
    fn map_in_place(&self, frame: &mut [u8], at: usize, dir: Direction) -> Result<bool, DropReason> {
        let field: &mut [u8; 16] = (&mut frame[at..at + 16]).try_into().expect("16 bytes");
        let addr = u128::from_be_bytes(*field);
        let Some(m) = self.mappings.iter().find(|m| m.covers(addr, dir)) else { return Ok(false) };
        let mapped = m.map(addr, dir).map_err(|Unmappable| DropReason::Nptv6Unmappable)?;
        *field = mapped.to_be_bytes();
        Ok(true)
    }
}

fn address_at(frame: &[u8], at: usize) -> u128 {
    u128::from_be_bytes(frame[at..at + 16].try_into().expect("16 bytes"))
}
