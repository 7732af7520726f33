//! The PCP server (RFC 6887) on natrix's inside address, UDP port 5351.
//!
//! A request is answered from the packet path, like an ICMP error: the
//! answer is a generated frame (the request's Ethernet addresses swapped,
//! IPv4 from the inside address, UDP from 5351 to the client's port) pushed
//! on the output queue, stamped with engine time. The request itself is
//! counted as `local_destination`, so every input frame is still either
//! forwarded or dropped once.
//!
//! PCP-created mappings are ordinary mappings, made by the same allocator
//! with the same quotas, logged and shown like any other. What PCP adds is a
//! *hold*: the mapping (MAP) or the session (PEER) must outlive its idle
//! timeout until the PCP lifetime ends. A MAP hold is a keep-alive session
//! on the mapping whose remote is 0.0.0.0:0 (an address no packet can come
//! from), so the mapping is never without a session while the hold lasts;
//! a PEER hold keeps the peer session itself. Once a second (before
//! sessions expire) the holds that are due are touched, and those whose
//! lifetime has ended are released: the keep-alive session goes, and with it
//! the mapping if no traffic session is left, through the usual deletion
//! (logged, port held down).
//!
//! Holds are found again by their key (protocol, internal endpoint, remote
//! endpoint), never by slab index, so state removed behind PCP's back
//! (`natrix clear`, a pool address removed on reload) only leaves a stale
//! hold that is dropped when next seen.

use std::collections::{BTreeMap, HashMap};

use natrix_wire::pcp::{self as wire, opcode, option, result};
use natrix_wire::{checksum, ethernet, ipv4, proto, set_u16_at, udp};

use crate::drop::DropReason;
use crate::nat44::pcp_ops::{FilterRule, NatOps};
use crate::pipeline::frame::Ip;
use crate::pipeline::router::Router;
use crate::state::sessions::mapping_flags;
use crate::state::timers::Wheel;
use crate::{Proto, Side};

/// `[pcp]` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcpConfig {
    /// Longest lifetime granted; longer requests get this.
    pub max_lifetime_s: u32,
}

impl Default for PcpConfig {
    fn default() -> Self {
        PcpConfig { max_lifetime_s: 24 * 3600 }
    }
}

/// Shortest lifetime granted to a request for a non-zero lifetime (unless
/// `max_lifetime` is shorter).
const MIN_LIFETIME_S: u32 = 120;
/// How long clients should take an error to hold (RFC 6887 section 7.4).
const LONG_ERROR_LIFETIME_S: u32 = 1800;
const SHORT_ERROR_LIFETIME_S: u32 = 30;
/// Where a response header's reserved 96 bits, and the last 96 bits of a
/// request's client address field, begin.
const RESERVED_AT: usize = 12;
/// Requests answered per second by one engine; the rest are silently
/// dropped, which clients treat as loss and retry (section 8.3).
const REQUESTS_PER_SECOND: u32 = 1000;
/// Of those, what one client may take, so that one host's flood leaves
/// the others their answers (section 18.1: a server limits each client).
const REQUESTS_PER_CLIENT_PER_SECOND: u32 = 100;
/// FILTER options one mapping may carry; more is EXCESSIVE_REMOTE_PEERS.
const MAX_FILTERS: usize = 16;
/// Holds are touched at least this often, so a shortened idle timeout
/// (a reload) cannot expire a held session early.
const MAX_TOUCH_INTERVAL_S: u32 = 60;
/// A hold is looked at within a minute or when its lifetime ends, so a
/// further look waits in the wheel's last slot.
const WHEEL_SLOTS: u32 = 128;
/// Where an unsolicited ANNOUNCE goes (section 14.1.3): all hosts.
const ALL_HOSTS: u32 = 0xe000_0001;
const ALL_HOSTS_MAC: [u8; 6] = [0x01, 0x00, 0x5e, 0x00, 0x00, 0x01];

/// What the server has done, for operators.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PcpStats {
    /// Datagrams to the inside address's port 5351.
    pub requests: u64,
    /// Requests not answered: too short, a response, a bad UDP checksum, or over the rate limit.
    pub ignored: u64,
    /// Answers sent, by result code.
    pub results: [u64; 16],
}

/// One PCP hold as an operator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcpHoldView {
    pub proto: Proto,
    pub int_addr: u32,
    pub int_port: u16,
    pub ext_addr: u32,
    pub ext_port: u16,
    /// PEER holds: the remote peer; MAP holds: 0.0.0.0:0.
    pub rem_addr: u32,
    pub rem_port: u16,
    pub remaining_s: u32,
    pub filters: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    proto: u8,
    int_addr: u32,
    int_port: u16,
    /// 0.0.0.0:0 for MAP.
    rem_addr: u32,
    rem_port: u16,
}

impl Key {
    fn proto(&self) -> Proto {
        if self.proto == Proto::Tcp as u8 {
            Proto::Tcp
        } else {
            Proto::Udp
        }
    }

    fn is_map(&self) -> bool {
        self.rem_addr == 0
    }
}

struct Hold {
    nonce: [u8; wire::NONCE_LEN],
    /// Engine second at which the PCP lifetime ends.
    expires_s: u32,
    /// When the hold is next looked at (its timer's second).
    due_s: u32,
    /// Empty: endpoint-independent filtering.
    filters: Vec<FilterRule>,
}

/// The PCP server of one engine.
pub(crate) struct PcpServer {
    cfg: Option<PcpConfig>,
    inside_addr: u32,
    holds: BTreeMap<Key, Hold>,
    /// Each hold's next look, on the timer wheel: entries index `timers`.
    wheel: Wheel<WHEEL_SLOTS>,
    timers: Vec<(u32, Key)>,
    free_timers: Vec<u32>,
    /// Engine second the epoch counts from (section 8.5).
    started_s: Option<u32>,
    window_s: u32,
    in_window: u32,
    /// Requests of each client in the current second (at most
    /// `REQUESTS_PER_SECOND` clients, since each took one).
    by_client: HashMap<u32, u32>,
    /// The request being answered undid a mapping it had made.
    undone: bool,
    stats: PcpStats,
}

/// A parsed MAP or PEER request.
struct MapRequest {
    nonce: [u8; wire::NONCE_LEN],
    protocol: u8,
    int_port: u16,
    /// Suggested external port; 0: none.
    ext_port: u16,
    /// Suggested external address; None: none (or not IPv4).
    ext_addr: Option<u32>,
    /// A suggested address that is set but is no IPv4 address.
    foreign_addr: bool,
    remote: Option<(u32, u16)>,
    prefer_failure: bool,
    filters: Vec<FilterRule>,
    /// The options this server processed, echoed in a success response.
    echoed: Vec<u8>,
}

/// An answer: a result code, the lifetime to report, and for success the
/// opcode data to send.
type Outcome = Result<(u32, Vec<u8>), u8>;

impl PcpServer {
    pub(crate) fn new(cfg: Option<PcpConfig>, inside_addr: u32) -> PcpServer {
        PcpServer {
            cfg,
            inside_addr,
            holds: BTreeMap::new(),
            wheel: Wheel::new(),
            timers: Vec::new(),
            free_timers: Vec::new(),
            started_s: None,
            window_s: 0,
            in_window: 0,
            by_client: HashMap::new(),
            undone: false,
            stats: PcpStats::default(),
        }
    }

    pub(crate) fn is_enabled(&self) -> bool {
        self.cfg.is_some()
    }

    pub(crate) fn reconfigure(&mut self, cfg: Option<PcpConfig>, inside_addr: u32) {
        self.cfg = cfg;
        self.inside_addr = inside_addr;
    }

    /// Counters of the PCP server.
    pub(crate) fn stats(&self) -> PcpStats {
        self.stats.clone()
    }

    /// Every live PCP hold (MAP mappings and PEER sessions), in key order.
    pub(crate) fn holds(&self, nat: &impl NatOps) -> Vec<PcpHoldView> {
        self.holds
            .iter()
            .filter_map(|(k, h)| {
                let sid = nat.find_session(k.proto(), k.int_addr, k.int_port, k.rem_addr, k.rem_port)?;
                let s = nat.session(sid);
                Some(PcpHoldView {
                    proto: k.proto(),
                    int_addr: k.int_addr,
                    int_port: k.int_port,
                    ext_addr: s.ext_addr,
                    ext_port: s.ext_port,
                    rem_addr: k.rem_addr,
                    rem_port: k.rem_port,
                    remaining_s: h.expires_s.saturating_sub(nat.now_s()),
                    filters: h.filters.len(),
                })
            })
            .collect()
    }

    /// The unsolicited ANNOUNCE a restarted server multicasts to 224.0.0.1
    /// port 5350 on the inside (RFC 6887 section 14.1.3), as a whole frame
    /// from `src_mac`, or None when PCP is disabled. The caller sends it as
    /// is (it needs no next hop).
    pub(crate) fn announcement(&mut self, src_mac: [u8; 6], now_s: u32, router: &mut Router) -> Option<Vec<u8>> {
        self.cfg?;
        let mut msg = [0u8; wire::HEADER_LEN];
        wire::emit_response_header(&mut msg, wire::VERSION, opcode::ANNOUNCE, result::SUCCESS, 0, self.epoch(now_s));
        let mut f = Vec::with_capacity(14 + 28 + msg.len());
        f.extend_from_slice(&ALL_HOSTS_MAC);
        f.extend_from_slice(&src_mac);
        f.extend_from_slice(&ethernet::ETHERTYPE_IPV4.to_be_bytes());
        append_udp(&mut f, self.inside_addr, ALL_HOSTS, wire::CLIENT_PORT, &msg, 1, router.next_ident());
        Some(f)
    }

    /// Whether a request of `client` at second `now` is answered: within
    /// the engine's budget for the second and within the client's share.
    fn within_budget(&mut self, client: u32, now: u32) -> bool {
        if self.window_s != now {
            self.window_s = now;
            self.in_window = 0;
            self.by_client.clear();
        }
        if self.in_window >= REQUESTS_PER_SECOND {
            return false;
        }
        let used = self.by_client.entry(client).or_insert(0);
        if *used >= REQUESTS_PER_CLIENT_PER_SECOND {
            return false;
        }
        *used += 1;
        self.in_window += 1;
        true
    }

    fn epoch(&mut self, now: u32) -> u32 {
        now - *self.started_s.get_or_insert(now)
    }

    /// Once a second, before sessions expire: touch the holds that are due
    /// and release those whose lifetime has ended. A hold whose mapping is
    /// gone before its lifetime ended (a clear, a pool address removed)
    /// is state the server lost, so the epoch starts again (section 8.5:
    /// clients then re-create their mappings). With PCP turned off by a
    /// reload, every hold is released.
    pub(crate) fn tick(&mut self, nat: &mut impl NatOps) {
        let now = nat.now_s();
        if self.cfg.is_none() {
            self.release_all(nat);
            // Turned on again, the server starts a new epoch: what it held is gone.
            self.started_s = None;
            return;
        }
        if self.started_s.is_none() {
            self.started_s = Some(now);
        }
        for (due, key) in self.due_timers(now) {
            let Some(h) = self.holds.get(&key) else { continue };
            if h.due_s != due {
                continue; // superseded by a refresh
            }
            let expires = h.expires_s;
            let Some(sid) = nat.find_session(key.proto(), key.int_addr, key.int_port, key.rem_addr, key.rem_port) else {
                self.forget(nat, &key);
                self.started_s = Some(now);
                continue;
            };
            if expires <= now {
                self.forget(nat, &key);
                if key.is_map() {
                    nat.release_keepalive(sid);
                }
                continue;
            }
            nat.touch(sid);
            self.schedule(nat, key, expires);
        }
    }

    /// After a clear (of subscriber `of`) or a reload (None: everyone's):
    /// forgets the holds whose mappings are gone and, if there were any,
    /// starts the epoch again (section 8.5).
    pub(crate) fn drop_lost_holds(&mut self, nat: &mut impl NatOps, of: Option<u32>) {
        let gone = |k: &&Key| nat.find_session(k.proto(), k.int_addr, k.int_port, k.rem_addr, k.rem_port).is_none();
        let lost: Vec<Key> = match of {
            None => self.holds.keys().filter(gone).copied().collect(),
            Some(addr) => [Proto::Tcp, Proto::Udp]
                .into_iter()
                .flat_map(|p| {
                    let first = Key { proto: p as u8, int_addr: addr, int_port: 0, rem_addr: 0, rem_port: 0 };
                    let last = Key { proto: p as u8, int_addr: addr, int_port: u16::MAX, rem_addr: u32::MAX, rem_port: u16::MAX };
                    self.holds.range(first..=last).map(|(k, _)| k)
                })
                .filter(gone)
                .copied()
                .collect(),
        };
        for key in &lost {
            self.forget(nat, key);
        }
        if !lost.is_empty() {
            self.started_s = Some(nat.now_s());
        }
    }

    fn release_all(&mut self, nat: &mut impl NatOps) {
        let keys: Vec<Key> = self.holds.keys().copied().collect();
        for key in keys {
            self.unhold(nat, key);
        }
    }

    /// Sets when a hold is next looked at: well before any session could
    /// idle out (half the shortest timeout, at most a minute), and when its
    /// lifetime ends.
    fn schedule(&mut self, nat: &impl NatOps, key: Key, expires_s: u32) {
        let now = nat.now_s();
        let interval = (nat.shortest_timeout() / 2).clamp(1, MAX_TOUCH_INTERVAL_S);
        let due = now.saturating_add(interval).min(expires_s).max(now.saturating_add(1));
        if let Some(h) = self.holds.get_mut(&key) {
            h.due_s = due;
            let id = self.free_timers.pop().unwrap_or_else(|| {
                self.timers.push((0, key));
                (self.timers.len() - 1) as u32
            });
            self.timers[id as usize] = (due, key);
            self.wheel.arm(id, due);
        }
    }

    /// The timers due by `now`, in (second, key) order.
    fn due_timers(&mut self, now: u32) -> Vec<(u32, Key)> {
        let mut due = Vec::new();
        let (timers, free) = (&self.timers, &mut self.free_timers);
        self.wheel.run(now, |id, _| {
            due.push(timers[id as usize]);
            free.push(id);
            None
        });
        due.sort_unstable();
        due
    }

    /// A UDP datagram to natrix's own address: answer it if it is PCP.
    /// `client` is the address the client knows itself by, which its
    /// request must name (section 8.1): its source, or for a DS-Lite host
    /// its address inside the softwire, the source being its stand-in.
    pub(crate) fn request(&mut self, frame: &[u8], ip: &Ip, client: u32, nat: &mut impl NatOps, router: &mut Router) {
        if ip.proto != proto::UDP || ip.first_frag || ip.later_frag {
            return;
        }
        let l4 = &frame[ip.l4..ip.l4 + ip.l4_len];
        let Ok(u) = udp::Packet::new_checked(l4) else { return };
        if u.dst_port() != wire::SERVER_PORT {
            return;
        }
        self.stats.requests += 1;
        let dgram = &l4[..usize::from(u.length())];
        if u.checksum() != 0 && !udp_checksum_ok(ip.src, ip.dst, dgram) {
            self.stats.ignored += 1;
            return;
        }
        // By the source as the engine knows it: a softwire host's stand-in,
        // as hosts behind different B4s often share one inner address.
        if !self.within_budget(ip.src, nat.now_s()) {
            self.stats.ignored += 1;
            return;
        }
        let Some(answer) = self.answer(ip, client, &dgram[udp::HEADER_LEN..], nat) else {
            self.stats.ignored += 1;
            return;
        };
        self.stats.results[usize::from(answer[3] & 0x0f)] += 1;
        // From the address the request went to: the inside address, or a
        // DS-Lite AFTR's 192.0.0.1.
        let (server, to, cport) = (ip.dst, ip.src, u.src_port());
        let l3 = ip.l3;
        router.emit(Side::Inside, |buf, ident| {
            buf.extend_from_slice(&frame[..l3]);
            ethernet::swap_addresses(buf);
            append_udp(buf, server, to, cport, &answer, 64, ident);
        });
    }

    /// Section 8.3: the answer to a request, or None when it is to be
    /// dropped silently.
    fn answer(&mut self, ip: &Ip, client: u32, msg: &[u8], nat: &mut impl NatOps) -> Option<Vec<u8>> {
        if msg.len() < 2 || msg[1] & wire::RESPONSE_BIT != 0 {
            return None;
        }
        let now = nat.now_s();
        let op = msg[1] & !wire::RESPONSE_BIT;
        if msg[0] != wire::VERSION {
            return Some(self.error(msg, op, result::UNSUPP_VERSION, now));
        }
        let req = wire::Request::new_checked(msg).ok()?;
        if msg.len() > wire::MAX_LEN || !msg.len().is_multiple_of(4) {
            return Some(self.error(msg, op, result::MALFORMED_REQUEST, now));
        }
        let data_len = match op {
            opcode::ANNOUNCE => 0,
            opcode::MAP => wire::MAP_LEN,
            opcode::PEER => wire::PEER_LEN,
            _ => return Some(self.error(msg, op, result::UNSUPP_OPCODE, now)),
        };
        let body = req.body();
        if body.len() < data_len {
            return Some(self.error(msg, op, result::MALFORMED_REQUEST, now));
        }
        if wire::v4_of(&req.client_addr()) != Some(client) {
            return Some(self.error(msg, op, result::ADDRESS_MISMATCH, now));
        }
        // A mapping this request makes and then undoes (a failed request
        // changes nothing, section 7.3) leaves no record.
        let mark = nat.events_mark();
        self.undone = false;
        let outcome = match op {
            opcode::ANNOUNCE => check_options(op, &body[data_len..]).map(|_| (0, Vec::new())),
            _ => match parse_map(op, body) {
                Err(code) => Err(code),
                Ok(m) if op == opcode::MAP => self.map(ip, req.lifetime(), m, nat),
                Ok(m) => self.peer(ip, req.lifetime(), m, nat),
            },
        };
        if std::mem::take(&mut self.undone) {
            nat.discard_mapping_events_since(mark);
        }
        Some(match outcome {
            Err(code) => self.error(msg, op, code, now),
            Ok((lifetime, data)) => {
                let mut out = vec![0u8; wire::HEADER_LEN];
                let epoch = self.epoch(now);
                wire::emit_response_header(&mut out, wire::VERSION, op, result::SUCCESS, lifetime, epoch);
                out.extend_from_slice(&data);
                out
            }
        })
    }

    /// An error response: the request copied (up to 1100 octets, padded to
    /// a multiple of 4), under a response header (section 8.3). For a
    /// request that did not parse, the header's reserved 96 bits keep the
    /// last 96 bits of its client address field (section 7.2).
    fn error(&mut self, msg: &[u8], op: u8, code: u8, now: u32) -> Vec<u8> {
        let mut out = msg[..msg.len().min(wire::MAX_LEN)].to_vec();
        out.resize(out.len().max(wire::HEADER_LEN).div_ceil(4) * 4, 0);
        let lifetime = if result::is_short_lifetime(code) { SHORT_ERROR_LIFETIME_S } else { LONG_ERROR_LIFETIME_S };
        let epoch = self.epoch(now);
        let client_tail: [u8; 12] = out[RESERVED_AT..wire::HEADER_LEN].try_into().expect("12 bytes");
        wire::emit_response_header(&mut out, wire::VERSION, op, code, lifetime, epoch);
        if result::means_unparsed(code) {
            out[RESERVED_AT..wire::HEADER_LEN].copy_from_slice(&client_tail);
        }
        out
    }

    fn grant(&self, requested: u32) -> u32 {
        let max = self.cfg.map_or(0, |p| p.max_lifetime_s).max(1);
        requested.clamp(MIN_LIFETIME_S.min(max), max)
    }

    /// Section 11: MAP.
    fn map(&mut self, ip: &Ip, lifetime: u32, m: MapRequest, nat: &mut impl NatOps) -> Outcome {
        let int = ip.src;
        if m.prefer_failure && m.ext_port == 0 && m.ext_addr.is_none() && !m.foreign_addr {
            return Err(result::MALFORMED_OPTION);
        }
        if lifetime == 0 {
            return self.map_delete(int, &m, nat).map(|_| (0, map_data(&m, m.ext_addr.map_or([0; 16], wire::v4_mapped), m.ext_port, &m.echoed)));
        }
        let proto = match m.protocol {
            proto::TCP => Proto::Tcp,
            proto::UDP => Proto::Udp,
            _ => return Err(result::UNSUPP_PROTOCOL),
        };
        // Section 11.1: "all ports" is a legal request natrix's policy
        // does not grant.
        if m.int_port == 0 {
            return Err(result::NOT_AUTHORIZED);
        }
        let granted = self.grant(lifetime);
        let key = Key { proto: proto as u8, int_addr: int, int_port: m.int_port, rem_addr: 0, rem_port: 0 };
        // A refresh of a mapping PCP already holds.
        if let Some(h) = self.holds.get(&key) {
            if let Some(sid) = nat.find_session(proto, int, m.int_port, 0, 0) {
                if h.nonce != m.nonce {
                    return Err(result::NOT_AUTHORIZED);
                }
                let s = nat.session(sid);
                if m.prefer_failure && !honours(&m, s.ext_addr, s.ext_port) {
                    return Err(result::CANNOT_PROVIDE_EXTERNAL);
                }
                self.hold(nat, key, m.nonce, granted, m.filters.clone());
                return Ok((granted, map_data(&m, wire::v4_mapped(s.ext_addr), s.ext_port, &m.echoed)));
            }
            self.forget(nat, &key);
        }
        // A mapping traffic (or the operator) made: PCP takes it over.
        if let Some(mid) = nat.find_mapping(proto, int, m.int_port) {
            let mp = nat.mapping(mid);
            if m.prefer_failure && !honours(&m, mp.ext_addr, mp.ext_port) {
                return Err(result::CANNOT_PROVIDE_EXTERNAL);
            }
            if mp.flags & mapping_flags::STATIC != 0 {
                // Configured: already permanent and unfiltered.
                let echoed = echo_without_filters(&m.echoed);
                return Ok((granted, map_data(&m, wire::v4_mapped(mp.ext_addr), mp.ext_port, &echoed)));
            }
            nat.keepalive(mid).map_err(result_of)?;
            self.hold(nat, key, m.nonce, granted, m.filters.clone());
            return Ok((granted, map_data(&m, wire::v4_mapped(mp.ext_addr), mp.ext_port, &m.echoed)));
        }
        let mid = self.new_mapping(proto, int, &m, nat)?;
        if let Err(r) = nat.keepalive(mid) {
            self.undo(nat, mid);
            return Err(result_of(r));
        }
        self.hold(nat, key, m.nonce, granted, m.filters.clone());
        let mp = nat.mapping(mid);
        Ok((granted, map_data(&m, wire::v4_mapped(mp.ext_addr), mp.ext_port, &m.echoed)))
    }

    /// MAP with lifetime 0: delete what PCP holds (one mapping, or with
    /// internal port 0 every one of the client's for the protocol, or for
    /// every protocol with protocol 0).
    fn map_delete(&mut self, int: u32, m: &MapRequest, nat: &mut impl NatOps) -> Result<(), u8> {
        if m.int_port == 0 {
            let keys: Vec<Key> = self
                .holds
                .iter()
                .filter(|(k, h)| k.int_addr == int && k.is_map() && (m.protocol == 0 || k.proto().ip_number() == m.protocol) && h.nonce == m.nonce)
                .map(|(k, _)| *k)
                .collect();
            for k in keys {
                self.unhold(nat, k);
            }
            return Ok(());
        }
        let proto = match m.protocol {
            proto::TCP => Proto::Tcp,
            proto::UDP => Proto::Udp,
            0 => return Err(result::MALFORMED_REQUEST),
            _ => return Err(result::UNSUPP_PROTOCOL),
        };
        let key = Key { proto: proto as u8, int_addr: int, int_port: m.int_port, rem_addr: 0, rem_port: 0 };
        if let Some(h) = self.holds.get(&key) {
            if nat.find_session(proto, int, m.int_port, 0, 0).is_some() && h.nonce != m.nonce {
                return Err(result::NOT_AUTHORIZED);
            }
            self.unhold(nat, key);
            return Ok(());
        }
        match nat.find_mapping(proto, int, m.int_port) {
            Some(mid) if nat.mapping(mid).flags & mapping_flags::STATIC != 0 => Err(result::NOT_AUTHORIZED),
            // A mapping PCP does not hold lives on as its traffic decides.
            _ => Ok(()),
        }
    }

    /// Section 12: PEER.
    fn peer(&mut self, ip: &Ip, lifetime: u32, m: MapRequest, nat: &mut impl NatOps) -> Outcome {
        let int = ip.src;
        // Section 12.1: a suggested external endpoint that cannot be had
        // is CANNOT_PROVIDE_EXTERNAL, as with PREFER_FAILURE.
        let m = MapRequest { prefer_failure: m.ext_port != 0 || m.ext_addr.is_some() || m.foreign_addr, ..m };
        let proto = match m.protocol {
            proto::TCP => Proto::Tcp,
            proto::UDP => Proto::Udp,
            0 => return Err(result::MALFORMED_REQUEST),
            _ => return Err(result::UNSUPP_PROTOCOL),
        };
        let Some((rem, rport)) = m.remote else { return Err(result::MALFORMED_REQUEST) };
        if m.int_port == 0 || rport == 0 || rem == 0 || crate::pipeline::frame::is_martian(rem) {
            return Err(result::MALFORMED_REQUEST);
        }
        let key = Key { proto: proto as u8, int_addr: int, int_port: m.int_port, rem_addr: rem, rem_port: rport };
        let existing = nat.find_session(proto, int, m.int_port, rem, rport);
        if let Some(h) = self.holds.get(&key) {
            if existing.is_some() && h.nonce != m.nonce {
                return Err(result::NOT_AUTHORIZED);
            }
        }
        if lifetime == 0 {
            // The session goes back to its idle timeout.
            self.forget(nat, &key);
            let (a, p) = existing.map_or((m.ext_addr.unwrap_or(0), m.ext_port), |s| {
                let s = nat.session(s);
                (s.ext_addr, s.ext_port)
            });
            return Ok((0, peer_data(&m, a, p)));
        }
        let granted = self.grant(lifetime);
        let sid = match existing {
            Some(s) if m.prefer_failure && !honours(&m, nat.session(s).ext_addr, nat.session(s).ext_port) => {
                return Err(result::CANNOT_PROVIDE_EXTERNAL);
            }
            Some(s) => s,
            None => {
                let (mid, new) = match nat.find_mapping(proto, int, m.int_port) {
                    Some(mid) if m.prefer_failure && !honours(&m, nat.mapping(mid).ext_addr, nat.mapping(mid).ext_port) => {
                        return Err(result::CANNOT_PROVIDE_EXTERNAL);
                    }
                    Some(mid) => (mid, false),
                    None => (self.new_mapping(proto, int, &m, nat)?, true),
                };
                match nat.create_session(mid, rem, rport) {
                    Ok(s) => s,
                    Err(r) => {
                        if new {
                            self.undo(nat, mid);
                        }
                        return Err(result_of(r));
                    }
                }
            }
        };
        nat.touch(sid);
        self.hold(nat, key, m.nonce, granted, Vec::new());
        let s = nat.session(sid);
        Ok((granted, peer_data(&m, s.ext_addr, s.ext_port)))
    }

    /// A new mapping for a PCP request, honouring the suggested external
    /// address and port when it can. With PREFER_FAILURE, a mapping that
    /// cannot be what was suggested is undone without a trace.
    fn new_mapping(&mut self, proto: Proto, int: u32, m: &MapRequest, nat: &mut impl NatOps) -> Result<u32, u8> {
        if let Some(a) = m.ext_addr.filter(|_| !nat.is_deterministic()) {
            // Paired pooling: a subscriber holding nothing yet may start on the suggested address.
            nat.suggest_address(int, a);
        }
        // A suggestion is honoured when free, the internal port too: with
        // `port_selection = "random"` the policy would not keep it.
        let hint = Some(m.ext_port).filter(|&p| p != 0);
        let mid = match hint {
            None => nat.create_mapping(proto, int, m.int_port),
            Some(want) => nat.create_mapping_at(proto, int, m.int_port, want),
        }
        .map_err(result_of)?;
        let mp = nat.mapping(mid);
        if m.prefer_failure && !honours(m, mp.ext_addr, mp.ext_port) {
            self.undo(nat, mid);
            return Err(result::CANNOT_PROVIDE_EXTERNAL);
        }
        Ok(mid)
    }

    /// Removes a mapping this request just made, as if it never was (and,
    /// see `answer`, not logged).
    fn undo(&mut self, nat: &mut impl NatOps, mid: u32) {
        nat.undo_mapping(mid);
        self.undone = true;
    }

    fn unhold(&mut self, nat: &mut impl NatOps, key: Key) {
        self.forget(nat, &key);
        if key.is_map() {
            if let Some(sid) = nat.find_session(key.proto(), key.int_addr, key.int_port, 0, 0) {
                nat.release_keepalive(sid);
            }
        }
    }

    fn hold(&mut self, nat: &mut impl NatOps, key: Key, nonce: [u8; wire::NONCE_LEN], lifetime: u32, filters: Vec<FilterRule>) {
        let expires_s = nat.now_s().saturating_add(lifetime);
        if key.is_map() {
            nat.set_filters(key.proto(), key.int_addr, key.int_port, Some(filters.clone()));
        }
        self.holds.insert(key, Hold { nonce, expires_s, due_s: 0, filters });
        self.schedule(nat, key, expires_s);
    }

    /// Drops a hold's record, and with a MAP hold the mapping's filters.
    fn forget(&mut self, nat: &mut impl NatOps, key: &Key) {
        if self.holds.remove(key).is_some() && key.is_map() {
            nat.set_filters(key.proto(), key.int_addr, key.int_port, None);
        }
    }
}

/// Whether an external endpoint is what the request suggested.
fn honours(m: &MapRequest, addr: u32, port: u16) -> bool {
    !m.foreign_addr && (m.ext_port == 0 || m.ext_port == port) && m.ext_addr.is_none_or(|a| a == addr)
}

fn result_of(r: DropReason) -> u8 {
    match r {
        DropReason::PortQuota | DropReason::SessionQuota | DropReason::MappingSessionQuota => result::USER_EX_QUOTA,
        // Deterministic mode: the source is no configured subscriber.
        r if r.name() == "not_subscriber" => result::NOT_AUTHORIZED,
        _ => result::NO_RESOURCES,
    }
}

/// Options of a request: every option is checked (section 7.3), the result
/// the first error found. Returns (PREFER_FAILURE seen, filters, options to echo).
fn check_options(op: u8, opts: &[u8]) -> Result<(bool, Vec<FilterRule>, Vec<u8>), u8> {
    let mut prefer_failure = false;
    let mut filters = Vec::new();
    let mut echoed = Vec::new();
    for o in wire::options(opts) {
        let o = o.map_err(|_| result::MALFORMED_OPTION)?;
        match o.code {
            // natrix acts for no one but the sender.
            option::THIRD_PARTY if op != opcode::ANNOUNCE => return Err(result::UNSUPP_OPTION),
            option::PREFER_FAILURE if op == opcode::MAP => {
                if !o.data.is_empty() || prefer_failure {
                    return Err(result::MALFORMED_OPTION);
                }
                prefer_failure = true;
                echo(&mut echoed, o.code, o.data);
            }
            option::FILTER if op == opcode::MAP => {
                let f = wire::Filter::parse(o.data).map_err(|_| result::MALFORMED_OPTION)?;
                match (f.prefix_len, wire::v4_of(&f.remote_addr)) {
                    // Section 13.3: "no filter", removing all previous
                    // filters, whatever its port.
                    (0, _) => filters.clear(),
                    (96..=128, Some(a)) => filters.push(FilterRule { addr: a, prefix_len: f.prefix_len - 96, port: f.remote_port }),
                    _ => return Err(result::MALFORMED_OPTION),
                }
                if filters.len() > MAX_FILTERS {
                    return Err(result::EXCESSIVE_REMOTE_PEERS);
                }
                echo(&mut echoed, o.code, o.data);
            }
            // Section 12.1: PEER implies it, and a PEER carrying it is malformed.
            option::PREFER_FAILURE if op == opcode::PEER => return Err(result::MALFORMED_REQUEST),
            option::THIRD_PARTY | option::PREFER_FAILURE | option::FILTER => return Err(result::MALFORMED_OPTION),
            c if option::is_mandatory(c) => return Err(result::UNSUPP_OPTION),
            _ => {}
        }
    }
    Ok((prefer_failure, filters, echoed))
}

fn echo(out: &mut Vec<u8>, code: u8, data: &[u8]) {
    let at = out.len();
    out.resize(at + option::HEADER_LEN + data.len().div_ceil(4) * 4, 0);
    wire::emit_option(&mut out[at..], code, data);
}

fn echo_without_filters(echoed: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for o in wire::options(echoed).flatten() {
        if o.code != option::FILTER {
            echo(&mut out, o.code, o.data);
        }
    }
    out
}

fn parse_map(op: u8, body: &[u8]) -> Result<MapRequest, u8> {
    let data_len = if op == opcode::PEER { wire::PEER_LEN } else { wire::MAP_LEN };
    let map = wire::Map::new_checked(&body[..wire::MAP_LEN]).map_err(|_| result::MALFORMED_REQUEST)?;
    let remote = if op == opcode::PEER {
        let p = wire::Peer::new_checked(&body[..wire::PEER_LEN]).map_err(|_| result::MALFORMED_REQUEST)?;
        Some((wire::v4_of(&p.remote_addr()).unwrap_or(0), p.remote_port()))
    } else {
        None
    };
    let (prefer_failure, filters, echoed) = check_options(op, &body[data_len..])?;
    let ext = map.external_addr();
    let ext_addr = wire::v4_of(&ext).filter(|&a| a != 0);
    Ok(MapRequest {
        nonce: map.nonce(),
        protocol: map.protocol(),
        int_port: map.internal_port(),
        ext_port: map.external_port(),
        ext_addr,
        foreign_addr: ext_addr.is_none() && !wire::is_unspecified(&ext),
        remote,
        prefer_failure,
        filters,
        echoed,
    })
}

fn map_data(m: &MapRequest, ext_addr: [u8; 16], ext_port: u16, echoed: &[u8]) -> Vec<u8> {
    let mut d = vec![0u8; wire::MAP_LEN];
    wire::emit_map(&mut d, m.nonce, m.protocol, m.int_port, (ext_addr, ext_port));
    d.extend_from_slice(echoed);
    d
}

fn peer_data(m: &MapRequest, ext_addr: u32, ext_port: u16) -> Vec<u8> {
    let mut d = vec![0u8; wire::PEER_LEN];
    let (rem, rport) = m.remote.unwrap_or((0, 0));
    wire::emit_peer(&mut d, m.nonce, m.protocol, m.int_port, (wire::v4_mapped(ext_addr), ext_port), (wire::v4_mapped(rem), rport));
    d.extend_from_slice(&m.echoed);
    d
}

fn udp_checksum_ok(src: u32, dst: u32, dgram: &[u8]) -> bool {
    let acc = u32::from(checksum::fold(checksum::pseudo_header_sum(src, dst, proto::UDP, dgram.len() as u16))) + u32::from(checksum::fold(checksum::sum(dgram)));
    checksum::fold(acc) == 0xffff
}

/// Appends an IPv4 header and a UDP datagram from port 5351 carrying
/// `payload`, with both checksums.
fn append_udp(buf: &mut Vec<u8>, src: u32, dst: u32, dport: u16, payload: &[u8], ttl: u8, ident: u16) {
    let ip_at = buf.len();
    let udp_len = udp::HEADER_LEN + payload.len();
    let total = ipv4::MIN_HEADER_LEN + udp_len;
    buf.resize(ip_at + total, 0);
    ipv4::emit_header(&mut buf[ip_at..], src, dst, proto::UDP, total as u16, ttl, ident);
    let u = ip_at + ipv4::MIN_HEADER_LEN;
    set_u16_at(buf, u, wire::SERVER_PORT);
    set_u16_at(buf, u + 2, dport);
    set_u16_at(buf, u + 4, udp_len as u16);
    buf[u + udp::HEADER_LEN..].copy_from_slice(payload);
    let acc = u32::from(checksum::fold(checksum::pseudo_header_sum(src, dst, proto::UDP, udp_len as u16))) + u32::from(checksum::fold(checksum::sum(&buf[u..])));
    let c = !checksum::fold(acc);
    set_u16_at(buf, u + udp::CHECKSUM_OFFSET, if c == 0 { 0xffff } else { c });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_match_prefix_and_port() {
        let f = FilterRule { addr: 0xc633_6400, prefix_len: 24, port: 53 };
        assert!(f.matches(0xc633_640d, 53));
        assert!(!f.matches(0xc633_650d, 53));
        assert!(!f.matches(0xc633_640d, 54));
        assert!(FilterRule { addr: 0, prefix_len: 0, port: 0 }.matches(1, 2));
    }

    fn filter_opt(prefix: u8, port: u16, addr: [u8; 16]) -> Vec<u8> {
        let mut v = Vec::new();
        echo(&mut v, option::FILTER, &wire::Filter { prefix_len: prefix, remote_port: port, remote_addr: addr }.emit());
        v
    }

    #[test]
    fn option_checks() {
        assert_eq!(check_options(opcode::MAP, &filter_opt(120, 0, wire::v4_mapped(0xc633_6400))).unwrap().1, vec![FilterRule { addr: 0xc633_6400, prefix_len: 24, port: 0 }]);
        assert_eq!(check_options(opcode::MAP, &filter_opt(95, 0, wire::v4_mapped(1))).unwrap_err(), result::MALFORMED_OPTION);
        assert_eq!(check_options(opcode::MAP, &filter_opt(120, 0, [0x20; 16])).unwrap_err(), result::MALFORMED_OPTION);
        assert_eq!(check_options(opcode::PEER, &filter_opt(120, 0, wire::v4_mapped(1))).unwrap_err(), result::MALFORMED_OPTION);
        let mut twice = Vec::new();
        echo(&mut twice, option::PREFER_FAILURE, &[]);
        echo(&mut twice, option::PREFER_FAILURE, &[]);
        assert_eq!(check_options(opcode::MAP, &twice).unwrap_err(), result::MALFORMED_OPTION);
        let mut unknown = Vec::new();
        echo(&mut unknown, 99, &[1, 2]);
        assert_eq!(check_options(opcode::MAP, &unknown).unwrap_err(), result::UNSUPP_OPTION);
        let mut optional = Vec::new();
        echo(&mut optional, 200, &[1, 2]);
        let (pf, filters, echoed) = check_options(opcode::MAP, &optional).unwrap();
        assert!(!pf && filters.is_empty() && echoed.is_empty());
        let mut many = Vec::new();
        for i in 0..=MAX_FILTERS as u32 {
            many.extend(filter_opt(128, 0, wire::v4_mapped(0x0a00_0000 + i)));
        }
        assert_eq!(check_options(opcode::MAP, &many).unwrap_err(), result::EXCESSIVE_REMOTE_PEERS);
        assert_eq!(check_options(opcode::MAP, &[3, 0, 0, 20, 0]).unwrap_err(), result::MALFORMED_OPTION);
    }

    #[test]
    fn generated_udp_has_valid_checksums() {
        let mut b = Vec::new();
        append_udp(&mut b, 0x6440_0001, 0x6440_0002, 40000, &[1, 2, 3, 4, 5], 64, 7);
        let ip = ipv4::Packet::new_checked(&b[..]).unwrap();
        assert!(ip.verify_checksum());
        assert!(udp_checksum_ok(0x6440_0001, 0x6440_0002, &b[20..]));
    }
}
