//! `natrix lab`: a throwaway network of namespaces for running natrix live
//! on one machine, and a demo that sends real traffic through it.
//!
//! Subscribers and servers each get a namespace; two bridges in `nx-sw`
//! stand in for the access and upstream switches, so the NAT namespace
//! `nx-nat` holds nothing but its `inside` and `outside` interfaces. Every
//! name starts with `nx-`, which is how `down` finds what to remove, also
//! after a crash. The names and addresses are fixed: the side-by-side
//! script and tests rely on them.
//!
//! IPv6 runs beside IPv4: subscribers in 2001:db8:1::/64 and servers in
//! 2001:db8:2::/64, natrix being ::1 in each (`address6`). The kernel in
//! nx-nat keeps IPv6 off (natrix answers NDP itself); the hosts have it on,
//! without router advertisements or duplicate address detection, so they
//! send nothing IPv6 until asked to.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use clap::Subcommand;

use crate::Failure;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    action: Option<Action>,
    /// Without a subcommand: the demo, with these settings.
    #[command(flatten)]
    demo: NatrixArgs,
}

#[derive(Subcommand)]
enum Action {
    /// Build the lab and write natrix's configuration for it.
    Up(UpArgs),
    /// Remove everything the lab created, also what a crashed run left behind.
    Down,
    /// Rebuild the lab, run natrix in it, send real traffic through it, tear it down (the default).
    Demo(NatrixArgs),
}

#[derive(clap::Args)]
struct UpArgs {
    /// Make nx-nat a Linux router with nftables masquerade instead (for side-by-side comparisons).
    #[arg(long)]
    kernel: bool,
    #[command(flatten)]
    natrix: NatrixArgs,
}

#[derive(clap::Args)]
struct NatrixArgs {
    /// Where to write natrix's configuration for the lab (not written with --kernel).
    #[arg(long, value_name = "FILE", default_value = "/run/natrix-lab/natrix.toml")]
    config_out: PathBuf,
    /// `workers` in the generated configuration.
    #[arg(long, value_name = "N", default_value_t = 1)]
    workers: u32,
    /// `io` in the generated configuration.
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = ["auto", "af_xdp", "af_packet"])]
    io: String,
    /// Receive and transmit queues of natrix's two interfaces and their peers (veth
    /// `numrxqueues`/`numtxqueues`): with at least as many as `--workers`, natrix runs
    /// per-queue workers over AF_XDP.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    queues: u32,
    /// `[nat] mode`: "dynamic" translates (NAPT44 with the lab's pool); "off" routes
    /// without translating, and the servers route 100.64.0.0/10 to the NAT (with --kernel:
    /// no masquerade).
    #[arg(long, value_name = "MODE", default_value = "dynamic", value_parser = ["dynamic", "off"])]
    mode: String,
    /// Frames nx-sw's ports towards the device hold, per transmit queue, while the device's
    /// receive ring is full (a FIFO qdisc, which veth fills instead of dropping from Linux
    /// 6.16 on, where the device's end runs NAPI); 0: none, veth's own `noqueue`.
    #[arg(long, value_name = "FRAMES", default_value_t = 0)]
    port_buffer: u32,
}

impl NatrixArgs {
    /// `--mode off`: route without translating.
    fn router(&self) -> bool {
        self.mode == "off"
    }
}

pub(crate) const SWITCH: &str = "nx-sw";
pub(crate) const NAT: &str = "nx-nat";
const BRIDGES: [&str; 2] = ["br-in", "br-out"];
/// natrix's interfaces: (name in nx-nat, peer in nx-sw, bridge).
pub(crate) const NAT_LINKS: [(&str, &str, &str); 2] = [("inside", "nx-nat-in", "br-in"), ("outside", "nx-nat-out", "br-out")];
/// The routed pool; servers reach it through the NAT's outside address.
const ROUTED_POOL: &str = "203.0.113.0/28";
/// The subscribers' prefix; servers route it to the NAT in router mode.
const SUBSCRIBERS: &str = "100.64.0.0/10";
/// The subscribers' IPv6 prefix; servers always route it to the NAT.
const SUBSCRIBERS6: &str = "2001:db8:1::/64";
const NAT_OUTSIDE: &str = "198.51.100.1";
const NAT_INSIDE6: &str = "2001:db8:1::1";
const NAT_OUTSIDE6: &str = "2001:db8:2::1";

/// A subscriber or server: one namespace with `eth0` on a bridge. Its peer
/// in nx-sw is named after the namespace.
struct Host {
    ns: &'static str,
    addr: &'static str,
    bridge: &'static str,
    route: &'static str,
    via: &'static str,
    addr6: &'static str,
    route6: &'static str,
    via6: &'static str,
}

impl Host {
    fn is_server(&self) -> bool {
        self.bridge == "br-out"
    }
}

const HOSTS: [Host; 5] = [
    Host { ns: "nx-sub1", addr: "100.64.0.2/10", bridge: "br-in", route: "default", via: "100.64.0.1", addr6: "2001:db8:1::2/64", route6: "default", via6: NAT_INSIDE6 },
    Host { ns: "nx-sub2", addr: "100.64.0.3/10", bridge: "br-in", route: "default", via: "100.64.0.1", addr6: "2001:db8:1::3/64", route6: "default", via6: NAT_INSIDE6 },
    Host { ns: "nx-srv1", addr: "198.51.100.11/24", bridge: "br-out", route: ROUTED_POOL, via: NAT_OUTSIDE, addr6: "2001:db8:2::11/64", route6: SUBSCRIBERS6, via6: NAT_OUTSIDE6 },
    Host { ns: "nx-srv2", addr: "198.51.100.12/24", bridge: "br-out", route: ROUTED_POOL, via: NAT_OUTSIDE, addr6: "2001:db8:2::12/64", route6: SUBSCRIBERS6, via6: NAT_OUTSIDE6 },
    Host { ns: "nx-srv3", addr: "198.51.100.13/24", bridge: "br-out", route: ROUTED_POOL, via: NAT_OUTSIDE, addr6: "2001:db8:2::13/64", route6: SUBSCRIBERS6, via6: NAT_OUTSIDE6 },
];

/// Kernel mode: the NAT namespace's addresses, the on-link pool address included.
const KERNEL_ADDRS: [(&str, &str); 3] = [("100.64.0.1/10", "inside"), ("198.51.100.1/24", "outside"), ("198.51.100.10/32", "outside")];
const KERNEL_ADDRS6: [(&str, &str); 2] = [("2001:db8:1::1/64", "inside"), ("2001:db8:2::1/64", "outside")];
const KERNEL_NAT: &str = "add table ip natrix_lab; \
    add chain ip natrix_lab postrouting { type nat hook postrouting priority srcnat; policy accept; }; \
    add rule ip natrix_lab postrouting oifname \"outside\" masquerade";

const SRV1: &str = "nx-srv1";
const HTTP_PORT: &str = "8080";
const IPERF_PORT: &str = "5201";
const WEB_ROOT: &str = "/run/natrix-lab/www";
const PAGE_MARKER: &str = "natrix lab test page";
const READY_TIMEOUT: Duration = Duration::from_secs(20);
const STOP_GRACE: Duration = Duration::from_secs(5);

pub fn run(args: &Args) -> Result<(), Failure> {
    require_root()?;
    match &args.action {
        Some(Action::Up(up_args)) => up(up_args.kernel, &up_args.natrix),
        Some(Action::Down) => down().map(|()| println!("lab down: nothing of the lab is left")),
        Some(Action::Demo(natrix)) => demo(natrix),
        None => demo(&args.demo),
    }
}

fn require_root() -> Result<(), Failure> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Failure::Other("natrix lab must run as root: it creates network namespaces (try sudo)".into()));
    }
    Ok(())
}

// ---- up -------------------------------------------------------------------

fn up(kernel: bool, natrix: &NatrixArgs) -> Result<(), Failure> {
    require_program("ip", "iproute2")?;
    require_program("ethtool", "ethtool")?;
    if kernel {
        require_program("nft", "nftables")?;
    }
    if natrix.port_buffer > 0 {
        require_program("tc", "iproute2")?;
    }
    if let Some(ns) = lab_namespaces()?.first() {
        return Err(Failure::Other(format!("namespace {ns} already exists: run `natrix lab down` first")));
    }
    // A half-built lab is worse than none: undo everything on any failure.
    if let Err(e) = build(kernel, natrix) {
        let _ = down();
        return Err(e);
    }
    if kernel && natrix.router() {
        println!("lab up: nx-nat is a Linux router (IPv4 and IPv6 forwarding, no masquerade)");
        return Ok(());
    }
    if kernel {
        println!("lab up: nx-nat is a Linux router with nftables masquerade (table ip natrix_lab)");
        return Ok(());
    }
    write_config(natrix)?;
    println!("lab up: natrix's configuration is in {}", natrix.config_out.display());
    println!("  start natrix with: ip netns exec {NAT} natrix run --config {}", natrix.config_out.display());
    Ok(())
}

fn require_program(program: &str, package: &str) -> Result<(), Failure> {
    match Command::new(program).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status() {
        Ok(_) => Ok(()),
        Err(_) => Err(Failure::Other(format!("{program} is missing: apt-get install -y {package}"))),
    }
}

fn build(kernel: bool, natrix: &NatrixArgs) -> Result<(), Failure> {
    let (router, queues) = (natrix.router(), natrix.queues);
    let namespaces = [SWITCH, NAT].into_iter().chain(HOSTS.iter().map(|h| h.ns));
    for ns in namespaces {
        add_namespace(ns)?;
    }
    for bridge in BRIDGES {
        ip(&["-n", SWITCH, "link", "add", "name", bridge, "type", "bridge"])?;
        ip(&["-n", SWITCH, "link", "set", bridge, "up"])?;
    }
    switch_without_ip_filtering()?;
    for (name, peer, bridge) in NAT_LINKS {
        cable(NAT, name, peer, bridge, queues)?;
        takes_redirects(peer);
        if natrix.port_buffer > 0 {
            port_buffer(peer, queues, natrix.port_buffer).map_err(Failure::Other)?;
        }
    }
    for h in &HOSTS {
        cable(h.ns, "eth0", h.ns, h.bridge, 1)?;
        ip(&["-n", h.ns, "addr", "add", h.addr, "dev", "eth0"])?;
        ip(&["-n", h.ns, "route", "add", h.route, "via", h.via])?;
        if router && h.is_server() {
            // Replies go to the subscribers' own addresses: nothing translates them.
            ip(&["-n", h.ns, "route", "add", SUBSCRIBERS, "via", NAT_OUTSIDE])?;
        }
        ipv6_on(h.ns, &["eth0"])?;
        ip(&["-n", h.ns, "-6", "addr", "add", h.addr6, "dev", "eth0", "nodad"])?;
        ip(&["-n", h.ns, "-6", "route", "add", h.route6, "via", h.via6])?;
    }
    if kernel {
        kernel_router(router)
    } else {
        // natrix owns these interfaces: with no addresses and no forwarding,
        // the kernel neither answers ARP nor sends RSTs or ICMP for natrix.
        sysctl(NAT, "net.ipv4.ip_forward=0")
    }
}

/// The switch only switches: where br_netfilter is loaded (Docker loads
/// it), each namespace's bridges would otherwise pass every frame through
/// the IP hooks, which cost the switch more CPU than the kernel's whole
/// NAT did and slowed every device measured behind it. -e: without
/// br_netfilter the keys do not exist, and nothing is to be done.
fn switch_without_ip_filtering() -> Result<(), Failure> {
    let keys = ["net.bridge.bridge-nf-call-iptables=0", "net.bridge.bridge-nf-call-ip6tables=0", "net.bridge.bridge-nf-call-arptables=0"];
    in_ns(SWITCH, "sysctl", &[&["-qwe"][..], &keys].concat()).map(drop).map_err(Failure::Other)
}

/// A namespace with `lo` up and IPv6 off, so router solicitations and MLD
/// reports do not show up in the NAT's counters or the benchmarks' totals.
fn add_namespace(ns: &str) -> Result<(), Failure> {
    ip(&["netns", "add", ns])?;
    ip(&["-n", ns, "link", "set", "lo", "up"])?;
    // -e: a kernel built without IPv6 has no such keys, and that is fine.
    in_ns(ns, "sysctl", &["-qwe", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]).map(drop).map_err(Failure::Other)
}

/// Turns IPv6 on for `devs` in `ns`, without router advertisements or
/// duplicate address detection (the lab's addresses are known unique), so
/// the kernel sends no router solicitations and no DAD probes. Without the
/// random start delay, the link-local address is usable at once: a kernel
/// router (`--kernel`) sends no Neighbor Solicitation for a forwarded
/// packet while it is still tentative. Every interface is set up before
/// `all.disable_ipv6` turns IPv6 on for all of them.
fn ipv6_on(ns: &str, devs: &[&str]) -> Result<(), Failure> {
    let scopes: Vec<&str> = ["all", "default"].into_iter().chain(devs.iter().copied()).collect();
    let mut settings = Vec::new();
    for key in ["accept_ra=0", "accept_dad=0", "router_solicitation_delay=0", "disable_ipv6=0"] {
        for scope in &scopes {
            settings.push(format!("net.ipv6.conf.{scope}.{key}"));
        }
    }
    let mut args = vec!["-qw"];
    args.extend(settings.iter().map(String::as_str));
    in_ns(ns, "sysctl", &args).map(drop).map_err(Failure::Other)
}

/// A veth pair from `bridge` in nx-sw to interface `name` in `ns`, both ends
/// up, with `queues` queues each way and without offloads (a real NIC hands
/// over complete frames). veth delivers a frame to the receive queue of the
/// transmit queue the sender's flow hash picked, so flows spread like RSS.
fn cable(ns: &str, name: &str, peer: &str, bridge: &str, queues: u32) -> Result<(), Failure> {
    let q = queues.to_string();
    let queues = ["numrxqueues", &q, "numtxqueues", &q];
    ip(&[&["-n", SWITCH, "link", "add", "name", peer][..], &queues, &["type", "veth", "peer", "name", name, "netns", ns], &queues].concat())?;
    ip(&["-n", SWITCH, "link", "set", peer, "master", bridge, "up"])?;
    ip(&["-n", ns, "link", "set", name, "up"])?;
    offloads_off(SWITCH, peer);
    offloads_off(ns, name);
    Ok(())
}

/// natrix's XDP offload redirects frames out of its interfaces, which a
/// veth takes only while its peer in nx-sw has NAPI, as GRO gives it (a
/// NIC's driver takes them by itself). The switch then merges the segments
/// it receives from the device under test, whichever it is. Best effort:
/// natrix says at start when the offload is off for want of it.
fn takes_redirects(peer: &str) {
    let _ = exec("ip", &["netns", "exec", SWITCH, "ethtool", "-K", peer, "gro", "on"]);
}

/// A switch port's buffer towards the device: a FIFO of `frames` per
/// transmit queue on the switch's end of a device link. Where the
/// device's end runs NAPI (an XDP program attached, as natrix's has),
/// veth queues what it sends there in a ring of 256 frames and, with no
/// qdisc, drops what finds the ring full; with one, it stops the queue
/// and the frames wait in the qdisc (Linux 6.16 on; older kernels drop as
/// before), and the CPU that drains the ring sends them on, in its
/// transmit softirq: the device's. The kernel's NAT, with no NAPI on its
/// ends, queues what arrives in its CPUs' backlogs (`netdev_max_backlog`)
/// and neither gains nor pays (docs/BENCHMARKS.md, "A switch port's
/// buffer").
fn port_buffer(peer: &str, queues: u32, frames: u32) -> Result<(), String> {
    for args in port_buffer_commands(peer, queues, frames) {
        in_ns(SWITCH, "tc", &args.iter().map(String::as_str).collect::<Vec<_>>())?;
    }
    Ok(())
}

/// tc's arguments for `port_buffer`, in order: one FIFO at the root, or
/// `mq` with a FIFO under each queue's class (tc numbers them in hex).
fn port_buffer_commands(peer: &str, queues: u32, frames: u32) -> Vec<Vec<String>> {
    let limit = frames.to_string();
    let args = |tail: &[&str]| ["qdisc", "replace", "dev", peer].iter().chain(tail).map(|a| a.to_string()).collect::<Vec<_>>();
    if queues <= 1 {
        return vec![args(&["root", "pfifo", "limit", &limit])];
    }
    let mut commands = vec![args(&["root", "handle", "1:", "mq"])];
    commands.extend((1..=queues).map(|q| args(&["parent", &format!("1:{q:x}"), "pfifo", "limit", &limit])));
    commands
}

/// Best effort: veth refuses some features depending on the kernel, and
/// ethtool then exits non-zero after switching off the rest.
fn offloads_off(ns: &str, dev: &str) {
    let _ = exec("ip", &["netns", "exec", ns, "ethtool", "-K", dev, "tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off"]);
}

/// nx-nat as a Linux router: natrix's addresses on its interfaces, IPv4
/// and IPv6 forwarding, and unless `router`, nftables masquerade for IPv4.
fn kernel_router(router: bool) -> Result<(), Failure> {
    for (addr, dev) in KERNEL_ADDRS {
        ip(&["-n", NAT, "addr", "add", addr, "dev", dev])?;
    }
    ipv6_on(NAT, &NAT_LINKS.map(|(dev, _, _)| dev))?;
    for (addr, dev) in KERNEL_ADDRS6 {
        ip(&["-n", NAT, "-6", "addr", "add", addr, "dev", dev, "nodad"])?;
    }
    sysctl(NAT, "net.ipv4.ip_forward=1")?;
    sysctl(NAT, "net.ipv6.conf.all.forwarding=1")?;
    if router {
        return Ok(());
    }
    in_ns(NAT, "nft", &[KERNEL_NAT]).map(drop).map_err(Failure::Other)
}

fn sysctl(ns: &str, setting: &str) -> Result<(), Failure> {
    in_ns(ns, "sysctl", &["-qw", setting]).map(drop).map_err(Failure::Other)
}

fn natrix_config(natrix: &NatrixArgs) -> String {
    let nat = if natrix.router() {
        "# Router mode: forwards IPv4 and IPv6 without translating.\nmode = \"off\"\n".to_owned()
    } else {
        format!(
            r#"pool = ["{ROUTED_POOL}", "198.51.100.10/32"]
ports = "1024-65535"
filtering = "endpoint-independent"
max_ports_per_subscriber = 2000
"#
        )
    };
    format!(
        r#"# natrix's configuration for `natrix lab` (generated; `natrix lab up` rewrites it).
workers = {workers}
io = "{io}"

[inside]
interface = "inside"
address = "100.64.0.1/10"
address6 = "{NAT_INSIDE6}/64"

[outside]
interface = "outside"
address = "{NAT_OUTSIDE}/24"
gateway = "198.51.100.11"
address6 = "{NAT_OUTSIDE6}/64"
gateway6 = "2001:db8:2::11"

[nat]
{nat}
[management]
listen = "127.0.0.1:9300"
"#,
        workers = natrix.workers,
        io = natrix.io,
    )
}

/// Writes the configuration and loads it back, so a lab never starts with
/// a file that `natrix run` would refuse.
fn write_config(natrix: &NatrixArgs) -> Result<(), Failure> {
    let path = &natrix.config_out;
    let fail = |e: std::io::Error| Failure::Other(format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    std::fs::write(path, natrix_config(natrix)).map_err(fail)?;
    natrix_control::Config::load(path).map(drop).map_err(|e| Failure::Config(format!("{}: {e}", path.display())))
}

// ---- down -----------------------------------------------------------------

/// Removes every `nx-` namespace. Processes still inside (a natrix or a
/// server from a crashed demo) are ended first, or the namespace would
/// live on, unnamed, with its interfaces. The veths go with their namespaces.
fn down() -> Result<(), Failure> {
    for ns in lab_namespaces()? {
        end_processes(&ns);
        ip(&["netns", "delete", &ns])?;
    }
    Ok(())
}

fn lab_namespaces() -> Result<Vec<String>, Failure> {
    let listing = run_cmd("ip", &["netns", "list"]).map_err(Failure::Other)?;
    // Lines look like "nx-sub1 (id: 3)" or just "nx-sub1".
    let names = listing.lines().filter_map(|l| l.split_whitespace().next()).filter(|n| n.starts_with("nx-"));
    Ok(names.map(str::to_owned).collect())
}

fn end_processes(ns: &str) {
    let me = std::process::id();
    let pids = || -> Vec<i32> {
        let listing = run_cmd("ip", &["netns", "pids", ns]).unwrap_or_default();
        listing.lines().filter_map(|l| l.trim().parse().ok()).filter(|&p: &i32| p.unsigned_abs() != me).collect()
    };
    for signal in [libc::SIGTERM, libc::SIGKILL] {
        let victims = pids();
        if victims.is_empty() {
            return;
        }
        for pid in victims {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, signal) };
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while !pids().is_empty() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
    }
}

// ---- demo -----------------------------------------------------------------

/// Set by SIGINT/SIGTERM during the demo, so that Ctrl-C still tears the lab down.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn catch_interrupts() {
    let handler = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Tears the lab down when the demo ends, however it ends.
struct Teardown;

impl Drop for Teardown {
    fn drop(&mut self) {
        match down() {
            Ok(()) => println!("{:<32} OK      lab removed", "lab down"),
            Err(e) => println!("{:<32} FAILED  {e}", "lab down"),
        }
    }
}

/// Step results, printed as they come.
#[derive(Default)]
struct Report {
    failed: usize,
}

impl Report {
    /// Prints one step's result; true when it succeeded and the demo should go on.
    fn step(&mut self, name: &str, result: Result<String, String>) -> bool {
        match result {
            Ok(detail) => {
                println!("{name:<32} OK      {detail}");
                !interrupted()
            }
            Err(e) => {
                self.failed += 1;
                println!("{name:<32} FAILED  {e}");
                false
            }
        }
    }

    fn finish(self) -> Result<(), Failure> {
        if interrupted() {
            return Err(Failure::Other("interrupted".into()));
        }
        match self.failed {
            0 => Ok(()),
            n => Err(Failure::Other(format!("{n} lab step(s) failed"))),
        }
    }
}

fn demo(natrix: &NatrixArgs) -> Result<(), Failure> {
    let exe = std::env::current_exe().map_err(|e| Failure::Other(format!("cannot find the natrix executable: {e}")))?;
    catch_interrupts();
    down()?;
    // Declared before the processes, so dropped after them: the lab goes last.
    let _teardown = Teardown;
    up(false, natrix)?;
    let mut report = Report::default();
    let servers = start_servers();
    if !report.step("servers in nx-srv1", servers.as_ref().map(|_| format!("http :{HTTP_PORT}, iperf3 :{IPERF_PORT}")).map_err(Clone::clone)) {
        return report.finish();
    }
    let mut natrix_run = match start_natrix(&exe, &natrix.config_out) {
        Ok(process) => process,
        Err(e) => {
            report.step("natrix run in nx-nat", Err(e));
            return report.finish();
        }
    };
    if report.step("natrix run in nx-nat", wait_ready(&mut natrix_run)) {
        traffic(&mut report, &exe);
        if !interrupted() {
            report.step("natrix stops on SIGTERM", natrix_run.stop().and_then(exit_ok));
        }
    }
    report.finish()
}

/// A traffic check: a detail line on success, what went wrong otherwise.
type Check = fn() -> Result<String, String>;

/// The traffic checks are independent: all run, whatever the others gave.
fn traffic(report: &mut Report, exe: &Path) {
    let steps: [(&str, Check); 4] =
        [("http sub1 -> srv1:8080", http_get), ("iperf3 tcp sub1 -> srv1, 3 s", iperf3), ("ping sub2 -> srv2", ping), ("udp sub1 -> srv2 closed port", udp_closed_port)];
    for (name, step) in steps {
        report.step(name, step());
        if interrupted() {
            return;
        }
    }
    show_stats(report, exe);
}

/// A process started in a lab namespace; ended (SIGTERM, then SIGKILL) when dropped.
struct Background {
    child: Child,
    /// Lines natrix prints on stdout, for the `ready` wait.
    lines: Option<mpsc::Receiver<String>>,
}

impl Background {
    fn spawn(ns: &str, program: &Path, args: &[&str]) -> Result<Background, String> {
        let child = Command::new("ip").args(["netns", "exec", ns]).arg(program).args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn();
        let child = child.map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        Ok(Background { child, lines: None })
    }

    fn stop(&mut self) -> Result<ExitStatus, String> {
        if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("had already exited ({status})"));
        }
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return Ok(status);
            }
            thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Err(format!("still running {} s after SIGTERM; killed", STOP_GRACE.as_secs()))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.stop();
        }
    }
}

fn exit_ok(status: ExitStatus) -> Result<String, String> {
    if status.success() {
        Ok("exit 0".into())
    } else {
        Err(format!("{status}"))
    }
}

fn start_servers() -> Result<[Background; 2], String> {
    let page = Path::new(WEB_ROOT).join("index.html");
    std::fs::create_dir_all(WEB_ROOT).and_then(|()| std::fs::write(&page, format!("<html><body>{PAGE_MARKER}</body></html>\n"))).map_err(|e| format!("{}: {e}", page.display()))?;
    let srv1_addr = host_addr(SRV1);
    let http = Background::spawn(SRV1, Path::new("python3"), &["-m", "http.server", HTTP_PORT, "--bind", srv1_addr, "--directory", WEB_ROOT])?;
    let iperf = Background::spawn(SRV1, Path::new("iperf3"), &["-s", "-B", srv1_addr, "-p", IPERF_PORT])?;
    wait_listening(SRV1, HTTP_PORT)?;
    wait_listening(SRV1, IPERF_PORT)?;
    Ok([http, iperf])
}

fn wait_listening(ns: &str, port: &str) -> Result<(), String> {
    let filter = format!("sport = :{port}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if in_ns(ns, "ss", &["-Hltn", &filter]).is_ok_and(|out| !out.trim().is_empty()) {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(100));
    }
    Err(format!("nothing listens on TCP port {port} in {ns} after 5 s"))
}

/// Starts `natrix run` in nx-nat, its output echoed with a prefix so it is
/// told apart from the demo's own lines.
fn start_natrix(exe: &Path, config: &Path) -> Result<Background, String> {
    let child =
        Command::new("ip").args(["netns", "exec", NAT]).arg(exe).arg("run").arg("--config").arg(config).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let mut child = child.map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let (tx, rx) = mpsc::channel();
    echo_lines(child.stdout.take(), Some(tx));
    echo_lines(child.stderr.take(), None);
    Ok(Background { child, lines: Some(rx) })
}

fn echo_lines(stream: Option<impl Read + Send + 'static>, forward: Option<mpsc::Sender<String>>) {
    let Some(stream) = stream else { return };
    thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            println!("    natrix | {line}");
            if let Some(tx) = &forward {
                let _ = tx.send(line);
            }
        }
    });
}

fn wait_ready(natrix: &mut Background) -> Result<String, String> {
    let lines = natrix.lines.take().ok_or("natrix's output is not captured")?;
    let started = Instant::now();
    while started.elapsed() < READY_TIMEOUT && !interrupted() {
        match lines.recv_timeout(Duration::from_millis(200)) {
            Ok(line) if line.contains("ready") => return Ok(format!("ready after {:.1} s", started.elapsed().as_secs_f64())),
            Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = natrix.child.wait().map_err(|e| e.to_string())?;
                return Err(format!("natrix exited ({status}) without printing a line containing \"ready\""));
            }
        }
    }
    if interrupted() {
        return Err("interrupted".into());
    }
    Err(format!("natrix printed no line containing \"ready\" within {} s", READY_TIMEOUT.as_secs()))
}

fn http_get() -> Result<String, String> {
    let url = format!("http://{}:{HTTP_PORT}/", host_addr(SRV1));
    let page = in_ns("nx-sub1", "timeout", &["10", "curl", "-sS", "--fail", "-m", "5", &url])?;
    if page.contains(PAGE_MARKER) {
        Ok(format!("GET {url}: {} bytes, the test page", page.len()))
    } else {
        Err(format!("GET {url} returned something else: {:?}", page.chars().take(80).collect::<String>()))
    }
}

fn iperf3() -> Result<String, String> {
    let out = exec("ip", &["netns", "exec", "nx-sub1", "timeout", "20", "iperf3", "-c", host_addr(SRV1), "-p", IPERF_PORT, "-t", "3", "-J"])?;
    let json: serde_json::Value = serde_json::from_str(&out.stdout).map_err(|_| format!("no iperf3 result: {}", out.stderr.trim()))?;
    if let Some(error) = json["error"].as_str() {
        return Err(error.to_owned());
    }
    let bps = json["end"]["sum_received"]["bits_per_second"].as_f64().ok_or("iperf3 reported no received throughput")?;
    let retransmits = json["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0);
    Ok(format!("{:.2} Gbit/s received, {retransmits} retransmits", bps / 1e9))
}

/// ICMP echo from a raw socket (iputils' ping is not always installed):
/// three requests, each waiting up to 1 s for its own reply.
const PING: &str = r#"
import os, socket, struct, sys, time
def csum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b)); s = (s >> 16) + (s & 0xffff); return ~(s + (s >> 16)) & 0xffff
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
ident, got, rtts = os.getpid() & 0xffff, 0, []
for seq in (1, 2, 3):
    p = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"natrix lab ping!"
    p = p[:2] + struct.pack("!H", csum(p)) + p[4:]
    t = time.time(); s.sendto(p, (sys.argv[1], 0))
    while time.time() < t + 1:
        s.settimeout(t + 1 - time.time())
        try: r = s.recv(2048)
        except socket.timeout: break
        h = (r[0] & 15) * 4
        if r[h] == 0 and struct.unpack("!HH", r[h + 4:h + 8]) == (ident, seq):
            got += 1; rtts.append((time.time() - t) * 1e3); break
    time.sleep(0.2)
print(got, round(max(rtts, default=0), 2))
"#;

fn ping() -> Result<String, String> {
    let out = in_ns("nx-sub2", "timeout", &["10", "python3", "-c", PING, host_addr("nx-srv2")])?;
    let mut fields = out.split_whitespace();
    let (got, max_rtt) = (fields.next().unwrap_or("0"), fields.next().unwrap_or("0"));
    match got {
        "3" => Ok(format!("3/3 echo replies, slowest {max_rtt} ms")),
        _ => Err(format!("{got}/3 echo replies")),
    }
}

/// A connected UDP socket learns of ICMP port unreachable as ECONNREFUSED:
/// this shows that srv2's ICMP error came back translated to the subscriber.
const UDP_CLOSED: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3); s.connect((sys.argv[1], 9))
s.send(b"natrix lab")
try: s.recv(100); print("a reply")
except ConnectionRefusedError: print("ConnectionRefusedError")
except socket.timeout: print("nothing within 3 s")
"#;

fn udp_closed_port() -> Result<String, String> {
    let out = in_ns("nx-sub1", "timeout", &["10", "python3", "-c", UDP_CLOSED, host_addr("nx-srv2")])?;
    match out.trim() {
        "ConnectionRefusedError" => Ok("ConnectionRefusedError: the ICMP port unreachable came back".into()),
        other => Err(format!("expected ConnectionRefusedError, got {other}")),
    }
}

/// `natrix show stats` is run if this build has it; management listens on
/// nx-nat's loopback, so it runs there.
fn show_stats(report: &mut Report, exe: &Path) {
    let name = "natrix show stats";
    let exe = exe.to_string_lossy();
    let result = exec("ip", &["netns", "exec", NAT, "timeout", "10", &exe, "show", "stats"]);
    match result {
        Ok(out) if out.stderr.contains("unrecognized subcommand") => println!("{name:<32} SKIPPED this build has no `natrix show`"),
        Ok(out) if out.ok => {
            report.step(name, Ok("the management API answered:".into()));
            out.stdout.lines().for_each(|l| println!("    {l}"));
        }
        Ok(out) => {
            report.step(name, Err(out.stderr.trim().to_owned()));
        }
        Err(e) => {
            report.step(name, Err(e));
        }
    }
}

/// A host's address without its prefix length.
fn host_addr(ns: &str) -> &'static str {
    let host = HOSTS.iter().find(|h| h.ns == ns).expect("a lab host");
    host.addr.split('/').next().unwrap_or(host.addr)
}

// ---- commands -------------------------------------------------------------

/// What a finished command printed, and whether it exited 0.
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs a command to completion; Err only when it could not be started.
fn exec(program: &str, args: &[&str]) -> Result<Ran, String> {
    let out = Command::new(program).args(args).stdin(Stdio::null()).output().map_err(|e| format!("cannot run {program}: {e}"))?;
    Ok(Ran { ok: out.status.success(), stdout: String::from_utf8_lossy(&out.stdout).into_owned(), stderr: String::from_utf8_lossy(&out.stderr).into_owned() })
}

/// Runs a command that must succeed and returns its stdout; the error
/// names the command and quotes what it said.
fn run_cmd(program: &str, args: &[&str]) -> Result<String, String> {
    let out = exec(program, args)?;
    if out.ok {
        return Ok(out.stdout);
    }
    let said = if out.stderr.trim().is_empty() { &out.stdout } else { &out.stderr };
    Err(format!("`{program} {}` failed: {}", args.join(" "), said.trim()))
}

fn in_ns(ns: &str, program: &str, args: &[&str]) -> Result<String, String> {
    let full: Vec<&str> = ["netns", "exec", ns, program].into_iter().chain(args.iter().copied()).collect();
    run_cmd("ip", &full)
}

fn ip(args: &[&str]) -> Result<(), Failure> {
    run_cmd("ip", args).map(drop).map_err(Failure::Other)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(mode: &str) -> NatrixArgs {
        NatrixArgs { config_out: PathBuf::from("unused"), workers: 2, io: "af_packet".into(), mode: mode.into(), queues: 1, port_buffer: 0 }
    }

    #[test]
    fn a_port_buffer_is_a_fifo_under_every_transmit_queue() {
        let line = |c: &Vec<String>| c.join(" ");
        let one: Vec<String> = port_buffer_commands("nx-nat-in", 1, 1000).iter().map(line).collect();
        assert_eq!(one, ["qdisc replace dev nx-nat-in root pfifo limit 1000"]);
        let twelve: Vec<String> = port_buffer_commands("nx-nat-out", 12, 300).iter().map(line).collect();
        assert_eq!(twelve.len(), 13);
        assert_eq!(twelve[0], "qdisc replace dev nx-nat-out root handle 1: mq");
        assert_eq!(twelve[1], "qdisc replace dev nx-nat-out parent 1:1 pfifo limit 300");
        assert_eq!(twelve[10], "qdisc replace dev nx-nat-out parent 1:a pfifo limit 300", "tc's class minors are hexadecimal");
        assert_eq!(twelve[12], "qdisc replace dev nx-nat-out parent 1:c pfifo limit 300");
    }

    #[test]
    fn napt_config_loads_with_ipv6() {
        let cfg = natrix_control::Config::parse(&natrix_config(&args("dynamic"))).expect("the lab's NAPT44 configuration loads");
        assert!(cfg.engine.translate);
        assert_eq!(cfg.live.gateway6, Some("2001:db8:2::11".parse().unwrap()));
        assert!(cfg.engine.inside_addr6.is_some() && cfg.engine.outside_addr6.is_some());
        assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
    }

    #[test]
    fn router_config_loads_without_translation_keys() {
        let text = natrix_config(&args("off"));
        let cfg = natrix_control::Config::parse(&text).expect("the lab's router configuration loads");
        assert!(!cfg.engine.translate);
        assert_eq!(cfg.live.gateway6, Some("2001:db8:2::11".parse().unwrap()));
        assert!(!text.contains("pool"), "{text}");
    }
}
