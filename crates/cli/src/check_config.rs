//! `natrix check-config [--live] FILE`: the preflight. Without `--live` it
//! checks what `replay` needs and warns about what `run` would still need;
//! with `--live` it requires everything `run` needs on this host: the keys,
//! the interfaces, writable log files and a free management address.
//! With `--cluster` it checks several nodes' files, each alone and then
//! together as one cluster (`natrix_control::cluster::check`).

use std::path::{Path, PathBuf};

use natrix_control::cluster::check::NodeFile;
use natrix_control::Config;
use natrix_engine::error::human_bytes;
use natrix_engine::Engine;

use crate::Failure;

#[derive(clap::Args)]
pub struct Args {
    /// The TOML configuration file (with --cluster: every node's file).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Also require everything `natrix run` needs here: interfaces that
    /// exist, the outside address, writable log paths, a free management address.
    #[arg(long, conflicts_with = "cluster")]
    live: bool,
    /// The files are a cluster's nodes: refuse overlaps and gaps between
    /// their partitions' subscriber prefixes and pool slices, and partners
    /// (active and standby) that differ.
    #[arg(long)]
    cluster: bool,
}

pub fn run(args: &Args) -> Result<(), Failure> {
    match args.files.as_slice() {
        [file] if !args.cluster => check_file(file, args.live).map(drop),
        files if args.cluster => check_cluster(files),
        _ => Err(Failure::Usage("check-config takes one file; give --cluster to check several nodes' files together".into())),
    }
}

/// Every file alone, then the files together; all problems are printed,
/// and the first file refused or any cluster problem fails the check.
fn check_cluster(files: &[PathBuf]) -> Result<(), Failure> {
    let mut configs = Vec::new();
    for path in files {
        configs.push((path.display().to_string(), check_file(path, false)?));
    }
    let nodes: Vec<NodeFile> = configs.iter().map(|(file, config)| NodeFile { file, config }).collect();
    match natrix_control::cluster::check::check(&nodes) {
        Ok(partitions) => {
            println!("cluster: valid ({} partitions, {} nodes; subscribers and pool covered without overlap or gap)", partitions.len(), nodes.len());
            for p in partitions {
                let standby = p.standby.map_or_else(|| "no standby".to_owned(), |s| format!("standby {s}"));
                let subs: Vec<String> = p.subscribers.iter().map(|s| natrix_control::config::cluster::show(*s)).collect();
                println!("  partition {}: active {}, {standby}; subscribers {}; {} pool addresses", p.name, p.active, subs.join(", "), p.pool_addresses);
            }
            Ok(())
        }
        Err(problems) => {
            for p in &problems[..problems.len() - 1] {
                eprintln!("natrix: cluster: {p}");
            }
            Err(Failure::Config(format!("cluster: {}", problems[problems.len() - 1])))
        }
    }
}

/// Checks one file and prints its summary.
fn check_file(path: &Path, live: bool) -> Result<Config, Failure> {
    let cfg = natrix_control::Config::load(path).map_err(|e| Failure::Config(format!("{}: {e}", path.display())))?;
    for w in &cfg.warnings {
        eprintln!("natrix: warning: {}: {w}", path.display());
    }
    let in_file = |problem: String| Failure::Config(format!("{}: {problem}", path.display()));
    let workers = cfg.live.workers;
    let reserved = Engine::reserved_bytes(&cfg.engine) * u64::from(workers);
    let under_load = Engine::bytes_under_load(&cfg.engine) * u64::from(workers);
    if live {
        // A CGN without a way off its outside link is not a live setup.
        if let Some(missing) = cfg.missing_for_run().into_iter().next() {
            return Err(in_file(missing.to_string()));
        }
        if let Some(advice) = cfg.advice_for_run().into_iter().next() {
            return Err(in_file(advice));
        }
        check_host(&cfg).map_err(in_file)?;
    } else {
        for missing in cfg.missing_for_run() {
            eprintln!("natrix: warning: {}: {missing}; replay works without it (check-config --live checks for run)", path.display());
        }
        for advice in cfg.advice_for_run() {
            eprintln!("natrix: warning: {}: {advice}", path.display());
        }
    }
    let e = &cfg.engine;
    // Router mode keeps no sessions; the SYN accelerator's table is sized alike.
    let sized_for = match (e.translate, e.syn_accel.is_some()) {
        (true, _) => format!("{} sessions", e.max_sessions),
        (false, true) => format!("{} pending SYN attempts", e.max_sessions),
        (false, false) => "router mode keeps no sessions".to_owned(),
    };
    let memory = Memory { reserved, under_load, sized_for, workers };
    if !e.translate {
        println!("{}: valid (router mode: IPv4 and IPv6 routed without translation)", path.display());
        memory.report(path);
        return Ok(cfg);
    }
    println!(
        "{}: valid ({} pool addresses, ports {}-{}, {} filtering, up to {} ports per subscriber)",
        path.display(),
        e.pool.len(),
        e.ports.0,
        e.ports.1,
        e.filtering.name(),
        e.max_ports_per_subscriber
    );
    memory.report(path);
    if let Some(d) = &e.dslite {
        let clamp = d.mss_clamp.map_or("off".to_owned(), |m| m.to_string());
        let b4s = match d.b4_prefixes.len() {
            0 => "any B4".to_owned(),
            1 => "B4s in 1 prefix".to_owned(),
            n => format!("B4s in {n} prefixes"),
        };
        println!("  DS-Lite AFTR {} ({b4s}, softwire MTU {}, MSS clamp {clamp})", d.aftr, d.mtu);
    }
    if let Some(c) = &cfg.cluster {
        println!("  cluster node {} ({}) of partition {}", c.node, c.role.name(), c.partition);
    }
    Ok(cfg)
}

/// The memory a configuration takes: reserved up front, and what tables
/// that grow with load may add.
struct Memory {
    reserved: u64,
    under_load: u64,
    /// What the tables are sized for.
    sized_for: String,
    workers: u32,
}

impl Memory {
    /// Prints it, and warns when it is more than this host has.
    fn report(&self, path: &Path) {
        println!(
            "  memory reserved up front: {} ({}{})",
            human_bytes(self.reserved),
            self.sized_for,
            if self.workers > 1 { format!(" in each of {} workers", self.workers) } else { String::new() }
        );
        if self.under_load > 0 {
            println!("  and up to {} more under load (the SYN accelerator's records of pending attempts)", human_bytes(self.under_load));
        }
        let Some(total) = physical_memory() else { return };
        if self.reserved + self.under_load > total {
            eprintln!(
                "natrix: warning: {}: the configuration reserves {} (and up to {} more under load) but this host has {}: lower nat.max_sessions",
                path.display(),
                human_bytes(self.reserved),
                human_bytes(self.under_load),
                human_bytes(total)
            );
        }
    }
}

/// What `run` needs from this host beyond the file: its interfaces, log
/// files it can write and a management address it can bind.
fn check_host(cfg: &Config) -> Result<(), String> {
    for (key, name) in [("inside.interface", &cfg.live.inside_interface), ("outside.interface", &cfg.live.outside_interface)] {
        if let Some(name) = name {
            let iface = natrix_io::iface::Interface::lookup(name).map_err(|e| format!("{key}: {e}"))?;
            natrix_io::check_frames_fit(name, iface.mtu).map_err(|e| format!("{key}: {e}"))?;
        }
    }
    if let Some(p) = &cfg.logging.json {
        writable(p).map_err(|e| format!("logging.json: {}: {e}", p.display()))?;
    }
    if let Some(listen) = &cfg.live.management_listen {
        std::net::TcpListener::bind(listen).map_err(|e| format!("management.listen: {listen}: {e}"))?;
    }
    Ok(())
}

/// Whether natrix could append to `p`, creating it if need be, without
/// creating it now.
fn writable(p: &Path) -> std::io::Result<()> {
    if p.exists() {
        return std::fs::OpenOptions::new().append(true).open(p).map(drop);
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // Creating a file is the one sure test that this user may write in the
    // folder, whatever its mode bits and mount options say.
    let probe = dir.join(format!(".natrix-check-{}", std::process::id()));
    std::fs::OpenOptions::new().write(true).create_new(true).open(&probe)?;
    std::fs::remove_file(probe)
}

/// The host's physical memory, from /proc/meminfo.
fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = text.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}
