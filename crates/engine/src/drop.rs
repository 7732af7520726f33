//! Every reason natrix drops a packet, declared once: the enum, the counter
//! names in reports and metrics, and their help text all come from this list.

macro_rules! drop_reasons {
    ($($variant:ident => $name:literal, $help:literal;)*) => {
        /// Why a frame was not forwarded.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum DropReason { $($variant,)* }

        impl DropReason {
            pub const ALL: &'static [DropReason] = &[$(DropReason::$variant,)*];
            pub const COUNT: usize = Self::ALL.len();

            /// The snake_case name used in reports and metric labels.
            pub fn name(self) -> &'static str {
                match self { $(DropReason::$variant => $name,)* }
            }

            pub fn help(self) -> &'static str {
                match self { $(DropReason::$variant => $help,)* }
            }
        }
    };
}

drop_reasons! {
    EthTruncated => "eth_truncated", "frame shorter than its Ethernet header or VLAN tags";
    NotIpv4 => "not_ipv4", "ethertype is neither IPv4 nor IPv6 (ARP, LLDP, ...)";
    Ipv4Truncated => "ipv4_truncated", "frame shorter than the IPv4 header or its total length";
    Ipv4BadVersion => "ipv4_bad_version", "IP version field is not 4";
    Ipv4BadHeaderLength => "ipv4_bad_header_length", "IHL below 5";
    Ipv4BadTotalLength => "ipv4_bad_total_length", "total length smaller than the header";
    Ipv4BadChecksum => "ipv4_bad_checksum", "IPv4 header checksum does not verify";
    Ipv6Truncated => "ipv6_truncated", "frame shorter than the IPv6 header or its payload length";
    Ipv6BadHeader => "ipv6_bad_header", "IPv6 version field is not 6, or extension headers that cannot be walked";
    Martian => "martian", "source or destination address that is never routed (0/8, 127/8, multicast, broadcast)";
    L4Truncated => "l4_truncated", "TCP, UDP or ICMP header truncated or malformed";
    IcmpBadChecksum => "icmp_bad_checksum", "ICMP error whose checksum does not verify (RFC 5508 REQ-3)";
    IcmpEmbeddedInvalid => "icmp_embedded_invalid", "ICMP error quoting a malformed datagram or one with a bad IP checksum";
    IcmpUnsupported => "icmp_unsupported", "ICMP type a NAT does not forward (redirect, router advertisement, ...)";
    IcmpErrorNoMapping => "icmp_error_no_mapping", "ICMP error about a flow natrix has no session for";
    IcmpErrorFragmented => "icmp_error_fragmented", "fragmented ICMP error (cannot be validated)";
    UnsupportedProtocol => "unsupported_protocol", "IP protocol natrix does not translate";
    SctpMalformed => "sctp_malformed", "SCTP packet without chunks, with a chunk or parameter examined whose length is below 4 or runs past the packet, or an INIT with a non-zero verification tag or a zero Initiate Tag";
    SctpNoAssociation => "sctp_no_association", "SCTP packet matching no association (out of the blue, seed 001 section 3.3); answered with ERROR-M where [sctp] reply_ootb says";
    SctpCollision => "sctp_collision", "SCTP INIT or ASCONF whose tag and ports collide with another subscriber's association; answered with ABORT-M or ERROR-M (seed 001 section 5.2.1)";
    TtlExpired => "ttl_expired", "TTL reached zero; ICMP time exceeded sent";
    FragmentationNeeded => "fragmentation_needed", "larger than the egress MTU with DF set; ICMP fragmentation needed sent (RFC 1191)";
    TooBig => "too_big", "larger than the egress MTU without DF, which leaves no room to fragment it";
    LocalDestination => "local_destination", "addressed to natrix itself";
    NotForPool => "not_for_pool", "arrived outside for an address outside the pool";
    NoMapping => "no_mapping", "inbound packet matching no mapping";
    Filtered => "filtered", "inbound packet refused by the filtering behaviour (RFC 4787 REQ-8)";
    UnsolicitedSyn => "unsolicited_syn", "inbound SYN with no mapping (RFC 5382 REQ-4)";
    PortQuota => "port_quota", "subscriber reached its external port limit";
    SessionQuota => "session_quota", "subscriber reached its session limit";
    MappingSessionQuota => "mapping_session_quota", "mapping reached its session limit (max_sessions_per_mapping, RFC 6888 REQ-5)";
    RateLimited => "rate_limited", "subscriber exceeded new mappings per second";
    PoolExhausted => "pool_exhausted", "no free external port on the subscriber's address";
    SessionTableFull => "session_table_full", "session table at capacity";
    SubscriberTableFull => "subscriber_table_full", "subscriber table at capacity";
    NotSubscriber => "not_subscriber", "deterministic mode: source address (or softwire B4) outside nat.subscribers";
    FragmentTimeout => "fragment_timeout", "fragment whose first fragment never arrived";
    FragmentBufferFull => "fragment_buffer_full", "out-of-order fragment pushed out of its full buffer, or larger than the buffer";
    FragmentTooSmall => "fragment_too_small", "first fragment too short to hold the transport ports (TCP: its whole header)";
    FragmentInTcpHeader => "fragment_in_tcp_header", "a later TCP fragment starting within the first 60 bytes, where it would overwrite the TCP header (RFC 1858's overlapping fragments), while a function inspects TCP";
    SynAbsorbed => "syn_absorbed", "a caller's own SYN retransmission for a connection attempt the SYN accelerator is retransmitting (seed 003)";
    HostIdPolicy => "host_id_policy", "a SYN (or a first ACK after a SYN-ACK, and that connection's later client segments) whose HOST_ID option matched a [[host_id.rule]] with action = \"drop\" (seed 000 section 8.5)";
    DsliteWrongAftr => "dslite_wrong_aftr", "IPv4-in-IPv6 on the inside addressed to another address than dslite.aftr";
    DsliteB4Refused => "dslite_b4_refused", "softwire packet from a B4 outside dslite.b4_prefixes";
    DsliteB4Hosts => "dslite_b4_hosts", "softwire packet from a new host behind a B4 that has max_ports_per_subscriber hosts already (each needs a port to matter)";
    DsliteEcnNotEctCe => "dslite_ecn_not_ect_ce", "softwire packet marked CE (congestion) outside around an inner packet that is not ECN-capable (RFC 6040 section 4.2), or outer fragments mixing ECN-capable and not";
    DsliteBadFragment => "dslite_bad_fragment", "softwire fragment that overlaps another (RFC 5722), runs past 65535 bytes, or is not a multiple of 8 bytes before the last";
    Nptv6Unmappable => "nptv6_unmappable", "IPv6 address in an NPTv6 prefix that RFC 6296 cannot map (subnet word, or every interface identifier word, 0xFFFF)";
}

impl DropReason {
    /// Refusals for lack of resources or quota: answered with ICMP (RFC 6888 REQ-11).
    pub fn is_resource(self) -> bool {
        matches!(
            self,
            DropReason::PortQuota
                | DropReason::SessionQuota
                | DropReason::MappingSessionQuota
                | DropReason::RateLimited
                | DropReason::PoolExhausted
                | DropReason::SessionTableFull
                | DropReason::SubscriberTableFull
        )
    }
}

/// One counter per drop reason.
#[derive(Debug, Clone)]
pub struct DropCounters([u64; DropReason::COUNT]);

impl Default for DropCounters {
    fn default() -> Self {
        DropCounters([0; DropReason::COUNT])
    }
}

impl DropCounters {
    #[inline]
    pub fn count(&mut self, reason: DropReason) {
        self.0[reason as usize] += 1;
    }

    pub fn get(&self, reason: DropReason) -> u64 {
        self.0[reason as usize]
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Non-zero counters by name.
    pub fn nonzero(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        DropReason::ALL.iter().filter(|r| self.get(**r) != 0).map(|r| (r.name(), self.get(*r)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_snake_case() {
        let mut names: Vec<_> = DropReason::ALL.iter().map(|r| r.name()).collect();
        assert!(names.iter().all(|n| n.chars().all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DropReason::COUNT);
    }
}
