//! NAT events for logging (RFC 6888 section 4, RFC 8158 natEvent values).
//! The engine only queues them in a bounded buffer; exporters drain it off
//! the packet path, and a full buffer counts the loss instead of blocking.

use crate::Proto;

/// natEvent values from the IANA IPFIX registry (RFC 8158).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EventKind {
    SessionCreated = 4,
    SessionDeleted = 5,
    MappingCreated = 8,
    MappingDeleted = 9,
    BlockAllocated = 16,
    BlockReleased = 17,
    AddressesExhausted = 3,
    PortsExhausted = 12,
    QuotaExceeded = 13,
}

impl EventKind {
    pub fn name(self) -> &'static str {
        match self {
            EventKind::SessionCreated => "session_create",
            EventKind::SessionDeleted => "session_delete",
            EventKind::MappingCreated => "mapping_create",
            EventKind::MappingDeleted => "mapping_delete",
            EventKind::BlockAllocated => "block_allocate",
            EventKind::BlockReleased => "block_release",
            EventKind::AddressesExhausted => "addresses_exhausted",
            EventKind::PortsExhausted => "ports_exhausted",
            EventKind::QuotaExceeded => "quota_exceeded",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub time_ns: u64,
    pub proto: Proto,
    pub int_addr: u32,
    pub int_port: u16,
    pub ext_addr: u32,
    /// First port of the mapping, or of the block.
    pub ext_port: u16,
    /// Last port of a block; equals `ext_port` otherwise.
    pub ext_port_end: u16,
    pub rem_addr: u32,
    pub rem_port: u16,
    /// A DS-Lite host's B4 (RFC 6333); `int_addr` is then the host's
    /// address inside the softwire. Filled in as events are drained.
    pub b4: Option<std::net::Ipv6Addr>,
}

pub struct EventQueue {
    buf: Vec<Event>,
    cap: usize,
    lost: u64,
}

impl EventQueue {
    pub fn new(cap: usize) -> Self {
        EventQueue { buf: Vec::with_capacity(cap), cap, lost: 0 }
    }

    #[inline]
    pub fn push(&mut self, e: Event) {
        if self.buf.len() < self.cap {
            self.buf.push(e);
        } else {
            self.lost += 1;
        }
    }

    pub fn drain(&mut self) -> std::vec::Drain<'_, Event> {
        self.buf.drain(..)
    }

    /// Events it holds between drains; more are lost (counted).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Events queued now; a mark for `since_mut` and `retain_since`.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The events queued after `mark`, to correct.
    pub fn since_mut(&mut self, mark: usize) -> std::slice::IterMut<'_, Event> {
        let from = mark.min(self.buf.len());
        self.buf[from..].iter_mut()
    }

    /// Keeps only the events queued after `mark` that `keep` accepts.
    pub fn retain_since(&mut self, mark: usize, mut keep: impl FnMut(&Event) -> bool) {
        let mut i = 0;
        self.buf.retain(|e| {
            i += 1;
            i <= mark || keep(e)
        });
    }

    pub fn lost(&self) -> u64 {
        self.lost
    }
}
