//! `[cluster]`: this node's place in a cluster of natrix nodes (issue #25,
//! docs/SCALE-OUT.md). A cluster is split into partitions; each partition
//! owns subscriber prefixes and a slice of the cluster's pool (its nodes'
//! `[nat] pool`), so plain longest-prefix routing takes both directions of
//! every flow to the same node, and is served by one active node and at
//! most one standby. One file describes one node; `natrix check-config
//! --cluster` holds the files together (`crate::cluster::check`).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use natrix_engine::EngineConfig;

use super::{err, parse_prefix, ConfigError, Section};

/// Which of its partition's nodes this one is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Forwards and announces its partition's prefixes at the preferred metric.
    Active,
    /// Takes over when the active node withdraws.
    Standby,
}

impl Role {
    pub const ALL: [Role; 2] = [Role::Active, Role::Standby];

    pub fn name(self) -> &'static str {
        match self {
            Role::Active => "active",
            Role::Standby => "standby",
        }
    }
}

/// An IPv4 prefix: network and length, host bits zero.
pub type Prefix4 = (u32, u8);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This node's name, unique in the cluster.
    pub node: String,
    /// The partition this node serves; an active node and its standby share it.
    pub partition: String,
    pub role: Role,
    /// The partition's subscriber prefixes: `[cluster] subscribers` in
    /// dynamic mode, `[nat] subscribers` (the formula's) in deterministic mode.
    pub subscribers: Vec<Prefix4>,
    /// Every subscriber prefix of the whole cluster, the same in every file:
    /// what the partitions together must cover exactly.
    pub subscriber_space: Vec<Prefix4>,
    /// The whole cluster's pool, the same in every file: the partitions'
    /// pools together must cover it exactly.
    pub pool_space: Vec<Prefix4>,
    /// Session sync with the partition's other node, if configured.
    pub sync: Option<SyncConfig>,
    /// How long a standby hears nothing from its active partner before it
    /// takes over (and how long a starting node listens before it does).
    pub peer_timeout_ms: u64,
    /// The BGP speaker that announces this node's prefixes, if configured.
    pub bgp: Option<BgpConfig>,
}

/// `[cluster] sync_listen` and `sync_peer`: the UDP endpoints of session sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncConfig {
    pub listen: SocketAddr,
    pub peer: SocketAddr,
}

/// `[cluster.bgp]`: the BIRD 2 instance natrix runs for its announcements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BgpConfig {
    pub local_as: u32,
    pub peer: Ipv4Addr,
    pub peer_as: u32,
    pub router_id: Ipv4Addr,
    /// BGP hold time in seconds (RFC 4271: 0 or at least 3); keepalives every third of it.
    pub hold_time: u32,
    /// AS path prepends a standby adds, so routers prefer the active node
    /// (a standby that took over adds one).
    pub standby_prepend: u32,
    /// The BIRD 2 daemon to run.
    pub bird: PathBuf,
    /// A BFD session (RFC 5880) beside the BGP session, so the router
    /// notices a node that stops answering (power lost, BIRD frozen, a
    /// link that dies without taking the interface down) in about half a
    /// second instead of the hold time. The router must run BFD too.
    pub bfd: bool,
}

pub(super) fn parse(root: &mut Section, e: &EngineConfig) -> Result<Option<ClusterConfig>, ConfigError> {
    let Some(mut s) = root.section("cluster")? else { return Ok(None) };
    if !e.translate {
        return err("cluster", "a cluster partitions subscribers and pool, which only a translating natrix has; [nat] mode = \"off\" routes: remove [cluster]");
    }
    let Some(node) = s.string("node")? else {
        return err("cluster.node", "missing: name this node, e.g. node = \"cgn-1a\"");
    };
    if !is_name(node) {
        return err("cluster.node", format!("\"{node}\": use letters, digits, '-', '_' and '.' (1-63 characters)"));
    }
    let partition = match s.string("partition")? {
        Some(p) if !is_name(p) => return err("cluster.partition", format!("\"{p}\": use letters, digits, '-', '_' and '.' (1-63 characters)")),
        Some(p) => p.to_owned(),
        None => node.to_owned(),
    };
    let Some(role) = s.choice("role", &Role::ALL.map(|r| (r.name(), r)))? else {
        return err("cluster.role", "missing: \"active\" or \"standby\"");
    };
    let subscribers = match &e.deterministic {
        Some(d) => {
            if s.has("subscribers") {
                return err("cluster.subscribers", "in deterministic mode the partition's subscribers are the formula's, nat.subscribers: remove this key");
            }
            d.prefixes().collect()
        }
        None => match prefixes(&mut s, "subscribers")? {
            Some(p) => p,
            None => return err("cluster.subscribers", "missing: the subscriber prefixes this partition owns, e.g. subscribers = [\"100.64.0.0/23\"]"),
        },
    };
    let Some(subscriber_space) = prefixes(&mut s, "subscriber_space")? else {
        return err("cluster.subscriber_space", "missing: every subscriber prefix of the cluster, the same in every node's file, e.g. subscriber_space = [\"100.64.0.0/22\"]");
    };
    let Some(pool_space) = prefixes(&mut s, "pool_space")? else {
        return err("cluster.pool_space", "missing: the whole cluster's pool, the same in every node's file, e.g. pool_space = [\"203.0.113.0/28\"]");
    };
    let sync = parse_sync(&mut s)?;
    let peer_timeout_ms = s.parsed("peer_timeout", crate::duration::parse_ms)?.unwrap_or(DEFAULT_PEER_TIMEOUT_MS);
    if !(100..=60_000).contains(&peer_timeout_ms) {
        return err("cluster.peer_timeout", format!("{peer_timeout_ms} ms is out of range 100ms-60s"));
    }
    let bgp = match s.section("bgp")? {
        Some(mut b) => {
            let bgp = parse_bgp(&mut b)?;
            b.finish()?;
            Some(bgp)
        }
        None => None,
    };
    s.finish()?;
    let key = if e.deterministic.is_some() { "nat.subscribers" } else { "cluster.subscribers" };
    if let Some(p) = subscribers.iter().find(|p| !covered(&subscriber_space, **p)) {
        return err(key, format!("{} is not in cluster.subscriber_space", show(*p)));
    }
    if let Some(a) = e.pool.iter().find(|&&a| !covered(&pool_space, (a, 32))) {
        return err("nat.pool", format!("{} is not in cluster.pool_space", Ipv4Addr::from(*a)));
    }
    Ok(Some(ClusterConfig { node: node.to_owned(), partition, role, subscribers, subscriber_space, pool_space, sync, peer_timeout_ms, bgp }))
}

const DEFAULT_PEER_TIMEOUT_MS: u64 = 1000;

fn parse_sync(s: &mut Section) -> Result<Option<SyncConfig>, ConfigError> {
    let endpoint = |t: &str| t.parse::<SocketAddr>().map_err(|_| format!("\"{t}\" is not ADDRESS:PORT, e.g. \"192.0.2.1:7400\""));
    let listen = s.parsed("sync_listen", endpoint)?;
    let peer = s.parsed("sync_peer", endpoint)?;
    match (listen, peer) {
        (Some(_), Some(peer)) if peer.ip().is_unspecified() || peer.port() == 0 => err("cluster.sync_peer", format!("{peer} is not an address to send to")),
        (Some(listen), Some(peer)) => Ok(Some(SyncConfig { listen, peer })),
        (None, None) => Ok(None),
        (Some(_), None) => err("cluster.sync_peer", "missing: sync_listen needs the partner's address, e.g. sync_peer = \"192.0.2.2:7400\""),
        (None, Some(_)) => err("cluster.sync_listen", "missing: sync_peer needs this node's own address, e.g. sync_listen = \"192.0.2.1:7400\""),
    }
}

fn parse_bgp(b: &mut Section) -> Result<BgpConfig, ConfigError> {
    let ipv4 = |t: &str| t.parse::<Ipv4Addr>().map_err(|_| format!("\"{t}\" is not an IPv4 address"));
    let asn = |b: &mut Section, key: &str| -> Result<u32, ConfigError> {
        let Some(v) = b.integer_u64(key)? else { return err(b.path(key), "missing: an AS number, e.g. 65001") };
        match u32::try_from(v) {
            Ok(n) if n > 0 => Ok(n),
            _ => err(b.path(key), format!("{v} is not an AS number (1-4294967295)")),
        }
    };
    let local_as = asn(b, "local_as")?;
    let peer_as = asn(b, "peer_as")?;
    let Some(peer) = b.parsed("peer", ipv4)? else { return err("cluster.bgp.peer", "missing: the router's address, e.g. peer = \"192.0.2.254\"") };
    let Some(router_id) = b.parsed("router_id", ipv4)? else { return err("cluster.bgp.router_id", "missing: this node's BGP identifier, usually its address towards the router") };
    let hold_time = b.integer("hold_time", 0, 65535)?.unwrap_or(3);
    if (1..3).contains(&hold_time) {
        return err("cluster.bgp.hold_time", "must be 0 or at least 3 seconds (RFC 4271 section 4.2)");
    }
    // At least 2: a standby that took over announces with one.
    let standby_prepend = b.integer("standby_prepend", 2, 16)?.unwrap_or(3);
    let bird = b.string("bird")?.map_or_else(|| PathBuf::from("bird"), PathBuf::from);
    let bfd = b.boolean("bfd")?.unwrap_or(false);
    Ok(BgpConfig { local_as, peer, peer_as, router_id, hold_time, standby_prepend, bird, bfd })
}

/// Names appear in messages, metrics labels and routing daemons' configs.
fn is_name(t: &str) -> bool {
    (1..=63).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// A non-empty list of prefixes whose entries do not overlap.
fn prefixes(s: &mut Section, key: &str) -> Result<Option<Vec<Prefix4>>, ConfigError> {
    let Some(list) = s.array(key)? else { return Ok(None) };
    let path = s.path(key);
    let mut out: Vec<Prefix4> = Vec::with_capacity(list.len());
    for (i, v) in list.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let Some(t) = v.as_str() else { return err(at, "expected a string like \"100.64.0.0/23\"") };
        let p = parse_prefix(t).or_else(|m| err(&at, m))?;
        if let Some(q) = out.iter().find(|q| overlap(**q, p)) {
            return err(at, format!("{t} overlaps {} listed before it", show(*q)));
        }
        out.push(p);
    }
    if out.is_empty() {
        return err(path, "empty: list at least one prefix");
    }
    Ok(Some(out))
}

/// The first and last address of a prefix, as numbers wide enough for /0.
pub fn span((net, len): Prefix4) -> (u64, u64) {
    let size = 1u64 << (32 - u32::from(len));
    (u64::from(net), u64::from(net) + size - 1)
}

fn overlap(a: Prefix4, b: Prefix4) -> bool {
    let ((a0, a1), (b0, b1)) = (span(a), span(b));
    a0 <= b1 && b0 <= a1
}

/// Whether one prefix of `space` holds all of `p`.
fn covered(space: &[Prefix4], p: Prefix4) -> bool {
    let (p0, p1) = span(p);
    space.iter().any(|q| {
        let (q0, q1) = span(*q);
        q0 <= p0 && p1 <= q1
    })
}

pub fn show((net, len): Prefix4) -> String {
    format!("{}/{len}", Ipv4Addr::from(net))
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const DYNAMIC: &str = "[nat]\npool = [\"203.0.113.0/29\"]\n[cluster]\nnode = \"a\"\nrole = \"active\"\nsubscribers = [\"100.64.0.0/23\"]\nsubscriber_space = [\"100.64.0.0/22\"]\npool_space = [\"203.0.113.0/28\"]\n";

    fn refusal(text: &str) -> (String, String) {
        let e = Config::parse(text).unwrap_err();
        (e.key, e.problem)
    }

    #[test]
    fn a_dynamic_node_parses_and_its_partition_defaults_to_its_name() {
        let c = Config::parse(DYNAMIC).unwrap().cluster.unwrap();
        assert_eq!(c.node, "a");
        assert_eq!(c.partition, "a");
        assert_eq!(c.role, super::Role::Active);
        assert_eq!(c.subscribers, vec![(0x6440_0000, 23)]);
    }

    #[test]
    fn a_deterministic_node_takes_its_subscribers_from_the_formula() {
        let text = "[nat]\nmode = \"deterministic\"\npool = [\"203.0.113.0/30\"]\nsubscribers = [\"100.64.0.0/26\", \"100.64.1.0/26\"]\nports_per_subscriber = 2016\n[cluster]\nnode = \"a\"\nrole = \"standby\"\npartition = \"p1\"\nsubscriber_space = [\"100.64.0.0/22\"]\npool_space = [\"203.0.113.0/28\"]\n";
        let c = Config::parse(text).unwrap().cluster.unwrap();
        assert_eq!(c.subscribers, vec![(0x6440_0000, 26), (0x6440_0100, 26)]);
        assert_eq!(c.partition, "p1");
        let (key, _) = refusal(&text.replace("[cluster]\n", "[cluster]\nsubscribers = [\"100.64.0.0/26\"]\n"));
        assert_eq!(key, "cluster.subscribers");
    }

    #[test]
    fn refusals_name_the_key() {
        assert_eq!(refusal(&DYNAMIC.replace("node = \"a\"\n", "")).0, "cluster.node");
        assert_eq!(refusal(&DYNAMIC.replace("node = \"a\"", "node = \"a b\"")).0, "cluster.node");
        assert_eq!(refusal(&DYNAMIC.replace("role = \"active\"", "role = \"primary\"")).0, "cluster.role");
        assert_eq!(refusal(&DYNAMIC.replace("subscribers = [\"100.64.0.0/23\"]\n", "")).0, "cluster.subscribers");
        assert_eq!(refusal(&DYNAMIC.replace("[\"100.64.0.0/23\"]", "[\"100.64.0.0/23\", \"100.64.1.0/24\"]")).0, "cluster.subscribers[1]");
        assert_eq!(refusal(&DYNAMIC.replace("100.64.0.0/23", "100.65.0.0/23")), ("cluster.subscribers".into(), "100.65.0.0/23 is not in cluster.subscriber_space".into()));
        assert_eq!(refusal(&DYNAMIC.replace("203.0.113.0/28", "203.0.113.0/30")), ("nat.pool".into(), "203.0.113.4 is not in cluster.pool_space".into()));
        assert_eq!(refusal(&DYNAMIC.replace("pool_space = [\"203.0.113.0/28\"]\n", "")).0, "cluster.pool_space");
        assert_eq!(refusal(&DYNAMIC.replace("[cluster]\n", "[cluster]\nbogus = 1\n")).0, "cluster.bogus");
        assert_eq!(refusal("[nat]\nmode = \"off\"\n[cluster]\nnode = \"a\"\n").0, "cluster");
    }

    /// A node with BGP takes a pool change live, as any node does: natrix
    /// announces the new pool on reload (`ClusterNode::set_routes`).
    #[test]
    fn a_pool_announced_by_bgp_changes_live() {
        let bgp = "[cluster.bgp]\nlocal_as = 65001\npeer_as = 65000\npeer = \"192.0.2.254\"\nrouter_id = \"192.0.2.1\"\n";
        let other_pool = |text: &str| text.replace("203.0.113.0/29", "203.0.113.8/29");
        let with_bgp = format!("{DYNAMIC}{bgp}");
        let running = Config::parse(&with_bgp).unwrap();
        assert_eq!(running.restart_key_changed(&Config::parse(&other_pool(&with_bgp)).unwrap()), None);
    }

    #[test]
    fn sync_and_bgp_parse_with_defaults_and_refusals_name_the_key() {
        let text = format!("{DYNAMIC}sync_listen = \"192.0.2.1:7400\"\nsync_peer = \"192.0.2.2:7400\"\npeer_timeout = \"500ms\"\n[cluster.bgp]\nlocal_as = 65001\npeer_as = 65000\npeer = \"192.0.2.254\"\nrouter_id = \"192.0.2.1\"\n");
        let c = Config::parse(&text).unwrap().cluster.unwrap();
        assert_eq!(c.sync.unwrap().peer, "192.0.2.2:7400".parse().unwrap());
        assert_eq!(c.peer_timeout_ms, 500);
        let b = c.bgp.unwrap();
        assert_eq!((b.local_as, b.peer_as, b.hold_time, b.standby_prepend), (65001, 65000, 3, 3));
        assert_eq!(b.bird, std::path::PathBuf::from("bird"));
        assert_eq!(refusal(&text.replace("sync_listen = \"192.0.2.1:7400\"\n", "")).0, "cluster.sync_listen");
        assert_eq!(refusal(&text.replace("192.0.2.2:7400", "0.0.0.0:7400")).0, "cluster.sync_peer");
        assert_eq!(refusal(&text.replace("500ms", "10ms")).0, "cluster.peer_timeout");
        assert_eq!(refusal(&format!("{text}hold_time = 2\n")).0, "cluster.bgp.hold_time");
        assert_eq!(refusal(&text.replace("local_as = 65001", "local_as = 0")).0, "cluster.bgp.local_as");
        assert_eq!(refusal(&text.replace("router_id = \"192.0.2.1\"\n", "")).0, "cluster.bgp.router_id");
        assert_eq!(refusal(&format!("{text}md5 = 1\n")).0, "cluster.bgp.md5");
    }
}
