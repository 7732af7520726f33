//! `natrix check-config --cluster`: the nodes' files held together. Each
//! partition has one active node and at most one standby with the same
//! subscribers and pool (the same formula in deterministic mode, so `whois`
//! answers the same after a failover); partitions share no subscriber
//! address and no pool address; together they cover the cluster's
//! `subscriber_space` and `pool_space` exactly, with no gap.

use std::collections::BTreeMap;
use std::fmt;

use crate::config::cluster::{show, span, ClusterConfig, Prefix4, Role};
use crate::Config;

/// One node's file: its name for messages and what it says.
pub struct NodeFile<'a> {
    pub file: &'a str,
    pub config: &'a Config,
}

/// An inclusive range of addresses, wide enough for 0.0.0.0/0.
type Range = (u64, u64);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterProblem {
    /// A file without `[cluster]`.
    NotANode {
        file: String,
    },
    DuplicateNode {
        node: String,
        files: [String; 2],
    },
    /// `subscriber_space` or `pool_space` differs from the first file's.
    SpaceDiffers {
        key: &'static str,
        file: String,
        first: String,
    },
    NoActive {
        partition: String,
    },
    TwoActive {
        partition: String,
        files: [String; 2],
    },
    TwoStandbys {
        partition: String,
        files: [String; 2],
    },
    /// An active node and its standby disagree on something a failover keeps.
    PartnersDiffer {
        partition: String,
        key: &'static str,
        files: [String; 2],
    },
    /// Partners whose `sync_peer` is not the other's `sync_listen`, or only one of which syncs.
    SyncNotPaired {
        partition: String,
        files: [String; 2],
    },
    Overlap {
        what: &'static str,
        partitions: [String; 2],
        addresses: Vec<Prefix4>,
    },
    Gap {
        what: &'static str,
        addresses: Vec<Prefix4>,
    },
}

impl fmt::Display for ClusterProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterProblem::NotANode { file } => write!(f, "{file}: no [cluster] section: every file given to --cluster describes one node"),
            ClusterProblem::DuplicateNode { node, files: [a, b] } => write!(f, "cluster.node \"{node}\" is used by both {a} and {b}: node names must be unique"),
            ClusterProblem::SpaceDiffers { key, file, first } => write!(f, "{file}: {key} differs from {first}'s: every node's file must give the same cluster-wide {key}"),
            ClusterProblem::NoActive { partition } => write!(f, "partition \"{partition}\" has no active node: its subscribers would not be served"),
            ClusterProblem::TwoActive { partition, files: [a, b] } => write!(f, "partition \"{partition}\" has two active nodes, {a} and {b}: one must be role = \"standby\""),
            ClusterProblem::TwoStandbys { partition, files: [a, b] } => {
                write!(f, "partition \"{partition}\" has two standby nodes, {a} and {b}: an active node syncs to one standby")
            }
            ClusterProblem::PartnersDiffer { partition, key, files: [a, b] } => {
                write!(f, "partition \"{partition}\": {key} differs between {a} and {b}: a standby must take over its active node's {key} as it is")
            }
            ClusterProblem::SyncNotPaired { partition, files: [a, b] } => {
                write!(f, "partition \"{partition}\": {a} and {b} do not sync with each other: each node's cluster.sync_peer must be the other's cluster.sync_listen")
            }
            ClusterProblem::Overlap { what, partitions: [a, b], addresses } => {
                write!(f, "{what} overlap: partitions \"{a}\" and \"{b}\" both own {}", list(addresses))
            }
            ClusterProblem::Gap { what, addresses } => {
                let verb = if addresses.len() == 1 { "is" } else { "are" };
                write!(f, "{what} gap: {} {verb} owned by no partition", list(addresses))
            }
        }
    }
}

impl std::error::Error for ClusterProblem {}

fn list(prefixes: &[Prefix4]) -> String {
    const SHOWN: usize = 8;
    let mut s: Vec<String> = prefixes.iter().take(SHOWN).map(|p| show(*p)).collect();
    if prefixes.len() > SHOWN {
        s.push(format!("and {} more prefixes", prefixes.len() - SHOWN));
    }
    s.join(", ")
}

/// A partition as the check found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub name: String,
    pub active: String,
    pub standby: Option<String>,
    pub subscribers: Vec<Prefix4>,
    pub pool_addresses: usize,
}

/// Every problem of the cluster, or its partitions by name.
pub fn check(nodes: &[NodeFile]) -> Result<Vec<Partition>, Vec<ClusterProblem>> {
    let mut problems = Vec::new();
    let mut members: Vec<(&NodeFile, &ClusterConfig)> = Vec::new();
    for n in nodes {
        match &n.config.cluster {
            Some(c) => members.push((n, c)),
            None => problems.push(ClusterProblem::NotANode { file: n.file.to_owned() }),
        }
    }
    check_names_and_spaces(&members, &mut problems);
    let mut by_partition: BTreeMap<&str, Vec<(&NodeFile, &ClusterConfig)>> = BTreeMap::new();
    for m in &members {
        by_partition.entry(m.1.partition.as_str()).or_default().push(*m);
    }
    let mut partitions = Vec::new();
    for (name, nodes) in &by_partition {
        if let Some(p) = check_partition(name, nodes, &mut problems) {
            partitions.push(p);
        }
    }
    if let Some((_, first)) = members.first() {
        let owners: Vec<(&str, Vec<Range>)> = by_partition.iter().map(|(name, nodes)| (*name, nodes[0].1.subscribers.iter().map(|p| span(*p)).collect())).collect();
        check_cover("subscriber", &first.subscriber_space, &owners, &mut problems);
        let owners: Vec<(&str, Vec<Range>)> = by_partition.iter().map(|(name, nodes)| (*name, ranges_of(&nodes[0].0.config.engine.pool))).collect();
        check_cover("pool", &first.pool_space, &owners, &mut problems);
    }
    if problems.is_empty() {
        Ok(partitions)
    } else {
        Err(problems)
    }
}

fn check_names_and_spaces(members: &[(&NodeFile, &ClusterConfig)], problems: &mut Vec<ClusterProblem>) {
    let Some((first_file, first)) = members.first() else { return };
    for (i, (n, c)) in members.iter().enumerate() {
        if let Some((other, _)) = members[..i].iter().find(|(_, o)| o.node == c.node) {
            problems.push(ClusterProblem::DuplicateNode { node: c.node.clone(), files: [other.file.to_owned(), n.file.to_owned()] });
        }
        for (key, differs) in [("cluster.subscriber_space", c.subscriber_space != first.subscriber_space), ("cluster.pool_space", c.pool_space != first.pool_space)] {
            if differs {
                problems.push(ClusterProblem::SpaceDiffers { key, file: n.file.to_owned(), first: first_file.file.to_owned() });
            }
        }
    }
}

/// One active, at most one standby, and the two alike in everything a
/// failover must keep: the subscribers, the pool, the port range, the
/// mode and its formula, the port blocks, how long a freed port is held
/// and the workers (a synced mapping goes to the worker of its
/// subscriber); and their sync endpoints must point at each other.
fn check_partition(name: &str, nodes: &[(&NodeFile, &ClusterConfig)], problems: &mut Vec<ClusterProblem>) -> Option<Partition> {
    let files = |a: &NodeFile, b: &NodeFile| [a.file.to_owned(), b.file.to_owned()];
    let of_role = |r: Role| nodes.iter().filter(move |(_, c)| c.role == r).map(|(n, _)| *n);
    let actives: Vec<&NodeFile> = of_role(Role::Active).collect();
    let standbys: Vec<&NodeFile> = of_role(Role::Standby).collect();
    match actives.as_slice() {
        [] => problems.push(ClusterProblem::NoActive { partition: name.to_owned() }),
        [_] => {}
        [a, b, ..] => problems.push(ClusterProblem::TwoActive { partition: name.to_owned(), files: files(a, b) }),
    }
    if let [a, b, ..] = standbys.as_slice() {
        problems.push(ClusterProblem::TwoStandbys { partition: name.to_owned(), files: files(a, b) });
    }
    let (first, first_c) = nodes[0];
    for (n, c) in &nodes[1..] {
        let (e, f) = (&first.config.engine, &n.config.engine);
        for (key, differs) in [
            ("the subscriber prefixes", c.subscribers != first_c.subscribers),
            ("nat.pool", e.pool != f.pool),
            ("nat.ports", e.ports != f.ports),
            ("nat.mode", e.deterministic.is_some() != f.deterministic.is_some()),
            ("the deterministic formula (nat.subscribers, nat.ports_per_subscriber)", e.deterministic != f.deterministic),
            ("nat.port_block_size", e.port_block_size != f.port_block_size),
            ("nat.hold_down", e.hold_down_s != f.hold_down_s),
            ("workers", first.config.live.workers != n.config.live.workers),
        ] {
            if differs {
                problems.push(ClusterProblem::PartnersDiffer { partition: name.to_owned(), key, files: files(first, n) });
                break;
            }
        }
        let paired = match (first_c.sync, c.sync) {
            (Some(a), Some(b)) => a.peer == b.listen && b.peer == a.listen,
            (None, None) => true,
            _ => false,
        };
        if !paired {
            problems.push(ClusterProblem::SyncNotPaired { partition: name.to_owned(), files: files(first, n) });
        }
    }
    let active = actives.first()?;
    Some(Partition {
        name: name.to_owned(),
        active: active.file.to_owned(),
        standby: standbys.first().map(|n| n.file.to_owned()),
        subscribers: first_c.subscribers.clone(),
        pool_addresses: first.config.engine.pool.len(),
    })
}

/// Partitions must not share addresses, and together must fill `space`.
fn check_cover(what: &'static str, space: &[Prefix4], owners: &[(&str, Vec<Range>)], problems: &mut Vec<ClusterProblem>) {
    let mut all: Vec<(Range, &str)> = owners.iter().flat_map(|(name, ranges)| ranges.iter().map(move |r| (*r, *name))).collect();
    all.sort_unstable();
    let mut overlaps: BTreeMap<(&str, &str), Vec<Range>> = BTreeMap::new();
    for (i, &((lo, hi), a)) in all.iter().enumerate() {
        for &((lo2, hi2), b) in all[i + 1..].iter().take_while(|((lo2, _), _)| *lo2 <= hi) {
            if a != b {
                let key = if a < b { (a, b) } else { (b, a) };
                overlaps.entry(key).or_default().push((lo.max(lo2), hi.min(hi2)));
            }
        }
    }
    for ((a, b), ranges) in overlaps {
        problems.push(ClusterProblem::Overlap { what, partitions: [a.to_owned(), b.to_owned()], addresses: ranges.into_iter().flat_map(to_prefixes).collect() });
    }
    let owned: Vec<Range> = all.iter().map(|(r, _)| *r).collect();
    let gaps: Vec<Prefix4> = space.iter().flat_map(|p| uncovered(span(*p), &owned)).flat_map(to_prefixes).collect();
    if !gaps.is_empty() {
        problems.push(ClusterProblem::Gap { what, addresses: gaps });
    }
}

/// Sorted, unique addresses as runs of consecutive ones.
fn ranges_of(addrs: &[u32]) -> Vec<Range> {
    let mut out: Vec<Range> = Vec::new();
    for &a in addrs {
        let a = u64::from(a);
        match out.last_mut() {
            Some((_, hi)) if *hi + 1 == a => *hi = a,
            _ => out.push((a, a)),
        }
    }
    out
}

/// The parts of `whole` that no range of `sorted` covers.
fn uncovered(whole: Range, sorted: &[Range]) -> Vec<Range> {
    let mut out = Vec::new();
    let mut next = whole.0;
    for &(lo, hi) in sorted {
        if hi < next || lo > whole.1 {
            continue;
        }
        if lo > next {
            out.push((next, lo - 1));
        }
        next = next.max(hi + 1);
    }
    if next <= whole.1 {
        out.push((next, whole.1));
    }
    out
}

/// The fewest prefixes that make up an inclusive range.
pub(crate) fn to_prefixes((mut lo, hi): Range) -> Vec<Prefix4> {
    let mut out = Vec::new();
    while lo <= hi {
        let mut len = if lo == 0 { 0 } else { 32 - lo.trailing_zeros().min(32) };
        while lo + (1u64 << (32 - len)) - 1 > hi {
            len += 1;
        }
        out.push((lo as u32, len as u8));
        lo += 1u64 << (32 - len);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranges_become_the_fewest_prefixes() {
        assert_eq!(to_prefixes((0x6440_0200, 0x6440_03ff)), vec![(0x6440_0200, 23)]);
        assert_eq!(to_prefixes((0x0a00_0001, 0x0a00_0006)), vec![(0x0a00_0001, 32), (0x0a00_0002, 31), (0x0a00_0004, 31), (0x0a00_0006, 32)]);
        assert_eq!(to_prefixes((0, 0xffff_ffff)), vec![(0, 0)]);
    }

    #[test]
    fn uncovered_parts_are_found_at_both_ends_and_between() {
        assert_eq!(uncovered((0, 99), &[(10, 19), (15, 29), (50, 59)]), vec![(0, 9), (30, 49), (60, 99)]);
        assert_eq!(uncovered((0, 9), &[(0, 9)]), vec![]);
    }

    proptest! {
        /// The prefixes cover exactly the range, each aligned to its size.
        #[test]
        fn prefixes_tile_their_range(a in any::<u32>(), b in any::<u32>()) {
            let (lo, hi) = (u64::from(a.min(b)), u64::from(a.max(b)));
            let mut next = lo;
            for (net, len) in to_prefixes((lo, hi)) {
                let size = 1u64 << (32 - u32::from(len));
                prop_assert_eq!(u64::from(net), next);
                prop_assert_eq!(u64::from(net) % size, 0);
                next += size;
            }
            prop_assert_eq!(next, hi + 1);
        }
    }
}
