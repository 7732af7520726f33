//! The node's announcements through a real BGP speaker: a BIRD 2 instance
//! natrix starts as its child, with its own configuration, control socket
//! and a routes file natrix rewrites (then `birdc configure`) when what it
//! announces changes. BIRD dies with natrix (PR_SET_PDEATHSIG), however
//! natrix ends, SIGKILL included: the kernel then closes the BGP session's
//! TCP connection and the router withdraws everything at once, without
//! waiting for the hold time.
//!
//! What is announced: each pool prefix with natrix's outside address as
//! next hop (return traffic), and a default route with natrix's inside
//! address as next hop (the router sends the partition's subscribers to it
//! by policy routing, docs/SCALE-OUT.md). Next hops are natrix's own data
//! addresses, third-party next hops on the router's links; BIRD sends them
//! unchanged (`next hop keep`). A standby prepends its AS so routers prefer
//! the active node.

use std::fmt::Write as _;
use std::io;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::config::cluster::{show, BgpConfig, Prefix4};

/// What the node announces while it forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    /// Prefixes and their next hop.
    pub routes: Vec<(Prefix4, Ipv4Addr)>,
    /// AS path prepends (a standby's lower preference); 0 for an active node.
    pub prepend: u32,
}

impl Announcement {
    /// The pool, aggregated, via the outside address, and the default route
    /// via the inside address.
    pub fn of_node(pool: &[u32], outside: Ipv4Addr, inside: Ipv4Addr) -> Vec<(Prefix4, Ipv4Addr)> {
        let mut routes: Vec<(Prefix4, Ipv4Addr)> = aggregate(pool).into_iter().map(|p| (p, outside)).collect();
        routes.push(((0, 0), inside));
        routes
    }
}

/// Sorted, unique addresses as the fewest prefixes.
fn aggregate(addrs: &[u32]) -> Vec<Prefix4> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < addrs.len() {
        let mut j = i;
        while j + 1 < addrs.len() && addrs[j + 1] == addrs[j].wrapping_add(1) {
            j += 1;
        }
        out.extend(crate::cluster::check::to_prefixes((u64::from(addrs[i]), u64::from(addrs[j]))));
        i = j + 1;
    }
    out
}

/// BIRD's configuration: the BGP session and a static protocol that takes
/// its routes from `routes`.
pub fn bird_config(cfg: &BgpConfig, routes: &Path) -> String {
    // Hold time 0 (RFC 4271: no keepalives): BIRD then takes no keepalive
    // time, which must lie between 1 and the hold time.
    let keepalive = match cfg.hold_time {
        0 => String::new(),
        hold => format!("  keepalive time {};\n", (hold / 3).max(1)),
    };
    let mut c = String::new();
    let _ = writeln!(c, "# Written by natrix: its announcements (docs/SCALE-OUT.md). Do not edit.");
    let _ = writeln!(c, "router id {};", cfg.router_id);
    let _ = writeln!(c, "protocol device {{ }}");
    let _ = writeln!(c, "protocol static announce {{\n  ipv4;\n  include \"{}\";\n}}", routes.display());
    if cfg.bfd {
        let _ = writeln!(c, "protocol bfd {{\n  interface \"*\" {{ interval {BFD_INTERVAL_MS} ms; multiplier {BFD_MULTIPLIER}; }};\n}}");
    }
    let bfd = if cfg.bfd { "  bfd on;\n" } else { "" };
    let _ = writeln!(
        c,
        "protocol bgp upstream {{\n  local as {};\n  neighbor {} as {};\n  hold time {};\n{keepalive}  connect retry time 1;\n  error wait time 1, 5;\n{bfd}  ipv4 {{ import none; export all; next hop keep; }};\n}}",
        cfg.local_as, cfg.peer, cfg.peer_as, cfg.hold_time
    );
    c
}

/// BFD's transmit and receive interval and how many intervals without a
/// packet end the session: a silent node is noticed in half a second.
const BFD_INTERVAL_MS: u32 = 100;
const BFD_MULTIPLIER: u32 = 5;

/// The routes file: one static route per prefix, with its next hop and
/// prepends as BGP attributes; empty when nothing is announced.
pub fn routes_file(a: Option<&Announcement>, local_as: u32) -> String {
    let mut c = String::from("# Written by natrix: what it announces now.\n");
    let Some(a) = a else { return c };
    for (prefix, via) in &a.routes {
        let prepends = format!("bgp_path.prepend({local_as}); ").repeat(a.prepend as usize);
        let _ = writeln!(c, "route {} blackhole {{ bgp_next_hop = {via}; {prepends}}};", show(*prefix));
    }
    c
}

/// Why the speaker could not be started or told.
#[derive(Debug)]
pub enum BgpError {
    Write(PathBuf, io::Error),
    Start(PathBuf, io::Error),
    /// `birdc configure` failed or BIRD refused the routes.
    Configure(String),
}

impl std::fmt::Display for BgpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BgpError::Write(p, e) => write!(f, "writing {}: {e}", p.display()),
            BgpError::Start(p, e) => write!(f, "starting {} (install bird2): {e}", p.display()),
            BgpError::Configure(why) => write!(f, "telling BIRD the new announcements: {why}"),
        }
    }
}

impl std::error::Error for BgpError {}

/// The running BIRD and what it announces.
pub struct Speaker {
    child: Child,
    birdc: PathBuf,
    dir: PathBuf,
    local_as: u32,
    announced: Option<Announcement>,
}

impl Speaker {
    /// Writes the configuration into `dir` (announcing nothing yet) and
    /// starts BIRD in the foreground as this thread's child.
    pub fn start(cfg: &BgpConfig, dir: &Path) -> Result<Speaker, BgpError> {
        std::fs::create_dir_all(dir).map_err(|e| BgpError::Write(dir.to_owned(), e))?;
        let (conf, routes) = (dir.join("bird.conf"), dir.join("routes.conf"));
        write(&routes, &routes_file(None, cfg.local_as))?;
        write(&conf, &bird_config(cfg, &routes))?;
        let mut cmd = Command::new(&cfg.bird);
        cmd.arg("-f").arg("-c").arg(&conf).arg("-s").arg(dir.join("bird.ctl")).stdin(Stdio::null()).stdout(Stdio::null());
        // SAFETY: prctl between fork and exec touches no memory of the
        // parent; the signal goes to BIRD when the thread that forked it
        // ends, which is the cluster thread, alive as long as natrix.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| BgpError::Start(cfg.bird.clone(), e))?;
        Ok(Speaker { child, birdc: birdc_of(&cfg.bird), dir: dir.to_owned(), local_as: cfg.local_as, announced: None })
    }

    /// Announces `a`, or withdraws everything (None); nothing happens when
    /// that is what is announced already.
    pub fn announce(&mut self, a: Option<Announcement>) -> Result<(), BgpError> {
        if a == self.announced {
            return Ok(());
        }
        let routes = self.dir.join("routes.conf");
        write(&routes, &routes_file(a.as_ref(), self.local_as))?;
        let out = Command::new(&self.birdc)
            .arg("-s")
            .arg(self.dir.join("bird.ctl"))
            .arg("configure")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| BgpError::Configure(format!("running birdc: {e}")))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !text.contains("Reconfigur") {
            return Err(BgpError::Configure(text.trim().to_owned()));
        }
        self.announced = a;
        Ok(())
    }

    pub fn announced(&self) -> Option<&Announcement> {
        self.announced.as_ref()
    }

    /// How BIRD ended, once it has: its announcements and session went
    /// with it, so nothing counts as announced any more.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.try_wait().ok().flatten()?;
        self.announced = None;
        Some(status)
    }

    /// Withdraws and stops BIRD (its session ends with a Cease).
    pub fn stop(mut self) {
        let _ = self.announce(None);
        // SAFETY: signals our own child by its pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

/// birdc beside the configured BIRD, or on PATH as BIRD is.
fn birdc_of(bird: &Path) -> PathBuf {
    match bird.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join("birdc"),
        _ => PathBuf::from("birdc"),
    }
}

fn write(path: &Path, text: &str) -> Result<(), BgpError> {
    std::fs::write(path, text).map_err(|e| BgpError::Write(path.to_owned(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_is_announced_aggregated_via_outside_and_the_default_via_inside() {
        let pool: Vec<u32> = (0xcb00_7100..0xcb00_7108).chain([0xcb00_710a]).collect();
        let (o, i) = (Ipv4Addr::new(198, 51, 100, 2), Ipv4Addr::new(100, 64, 0, 1));
        assert_eq!(Announcement::of_node(&pool, o, i), vec![((0xcb00_7100, 29), o), ((0xcb00_710a, 32), o), ((0, 0), i)]);
    }

    #[test]
    fn routes_carry_next_hops_and_a_standbys_prepends() {
        let a = Announcement { routes: vec![((0xcb00_7100, 29), Ipv4Addr::new(198, 51, 100, 2))], prepend: 2 };
        assert_eq!(
            routes_file(Some(&a), 65001),
            "# Written by natrix: what it announces now.\nroute 203.0.113.0/29 blackhole { bgp_next_hop = 198.51.100.2; bgp_path.prepend(65001); bgp_path.prepend(65001); };\n"
        );
        assert_eq!(routes_file(None, 65001).lines().count(), 1);
    }

    /// BIRD itself (`bird -p`: parse and exit) accepts what natrix writes.
    #[test]
    fn bird_parses_the_configuration_and_routes() {
        if Command::new("bird").arg("--version").output().is_err() {
            eprintln!("skipped: bird not installed (apt-get install bird2)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("natrix-bird-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (bfd, hold_time) in [(false, 3), (true, 3), (false, 0), (false, 90)] {
            let cfg = BgpConfig {
                local_as: 65001,
                peer: Ipv4Addr::new(192, 0, 2, 254),
                peer_as: 65000,
                router_id: Ipv4Addr::new(192, 0, 2, 1),
                hold_time,
                standby_prepend: 3,
                bird: PathBuf::from("bird"),
                bfd,
            };
            let a = Announcement { routes: Announcement::of_node(&[0xcb00_7100, 0xcb00_7101], Ipv4Addr::new(198, 51, 100, 2), Ipv4Addr::new(100, 64, 0, 1)), prepend: 3 };
            let routes = dir.join("routes.conf");
            std::fs::write(&routes, routes_file(Some(&a), 65001)).unwrap();
            let conf = bird_config(&cfg, &routes);
            assert_eq!(conf.contains("bfd on;") && conf.contains("protocol bfd"), bfd, "{conf}");
            std::fs::write(dir.join("bird.conf"), conf).unwrap();
            let out = Command::new("bird").arg("-p").arg("-c").arg(dir.join("bird.conf")).output().unwrap();
            assert!(out.status.success(), "bfd = {bfd}, hold time {hold_time}: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
