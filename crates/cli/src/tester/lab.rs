//! The namespace lab as the tester uses it: built with `natrix lab up`
//! (or one that `natrix lab up` left, when its kind fits the device),
//! nx-nat prepared for the device, the tester's ports opened inside
//! nx-sub1 and nx-srv1 (and nx-sub2 for the generator's own test), and
//! everything the tester changed undone at the end.
//!
//! The tester simulates subscribers 100.64.1.1 and up behind nx-sub1's
//! eth0 and a server 198.51.100.21 behind nx-srv1's, answering ARP for
//! them itself: its AF_XDP ports take every frame of those interfaces, so
//! it also answers for the hosts' own addresses there.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use natrix_io::iface::Interface;
use natrix_tester::engine::{AddrRange, Expect, Link, Tester};
use natrix_tester::flows::FlowSpace;
use natrix_tester::ports::{self, Io, Unconnected};
use natrix_tester::sys::in_netns;

use crate::lab::NAT_LINKS;
use crate::Failure;

pub const NAT_NS: &str = crate::lab::NAT;
const SWITCH_NS: &str = crate::lab::SWITCH;
/// The device's two links in nx-nat, as `natrix lab up` names them.
const DEVICE_LINKS: [&str; 2] = [NAT_LINKS[0].0, NAT_LINKS[1].0];
/// Their ends in nx-sw: what the device sends arrives there.
const DEVICE_PEERS: [&str; 2] = [NAT_LINKS[0].1, NAT_LINKS[1].1];
/// br_netfilter's keys, where it is loaded: bridged frames through netfilter's hooks.
const BRIDGE_FILTERING: [&str; 3] =
    ["/proc/sys/net/bridge/bridge-nf-call-iptables", "/proc/sys/net/bridge/bridge-nf-call-ip6tables", "/proc/sys/net/bridge/bridge-nf-call-arptables"];
const SUB1: (&str, Ipv4Addr) = ("nx-sub1", Ipv4Addr::new(100, 64, 0, 2));
const SUB2: (&str, Ipv4Addr) = ("nx-sub2", Ipv4Addr::new(100, 64, 0, 3));
const SRV1: (&str, Ipv4Addr) = ("nx-srv1", Ipv4Addr::new(198, 51, 100, 11));
/// The device's own addresses on the two links (natrix's and the kernel's alike).
pub const INSIDE_ROUTER: Ipv4Addr = Ipv4Addr::new(100, 64, 0, 1);
pub const OUTSIDE_ROUTER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const FIRST_SUBSCRIBER: Ipv4Addr = Ipv4Addr::new(100, 64, 1, 1);
pub const SUBSCRIBERS: u32 = 16;
pub const SERVER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 21);
const DPORTS: u32 = 64;
/// Where `natrix lab up` writes natrix's configuration by default.
const LAB_CONFIG: &str = "/run/natrix-lab/natrix.toml";
/// conntrack's UDP timeouts in nx-nat while the kernel is tested: as
/// natrix's default UDP timeout, and long enough that no connection of
/// the preliminary phase expires before the real test phase uses it
/// (RFC 9693 section 4.3).
const KERNEL_UDP_TIMEOUTS: [(&str, &str); 2] = [("/proc/sys/net/netfilter/nf_conntrack_udp_timeout", "300"), ("/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream", "300")];

/// Which device the lab's nx-nat holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Natrix,
    Kernel,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Natrix => "natrix",
            Kind::Kernel => "kernel",
        }
    }
}

/// Where the switch receives what the device sends (`--switch-napi`).
/// veth runs it in softirq on the CPU that sent the frame: the device's,
/// which then pays for the switch's GRO of every frame it sends
/// (docs/BENCHMARKS.md, "What the switch's GRO costs the device"). In
/// NAPI threads on the lab's CPUs it is the lab's, as on a separate
/// machine; on a host whose only lab CPU is the tester's, those threads
/// starve behind the generator.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum SwitchNapi {
    /// In softirq on the CPU that sent (the device's), as veth does it.
    Sender,
    /// In NAPI threads on the lab's CPUs at SCHED_FIFO 50.
    Lab,
}

/// The lab, for as long as the tester uses it.
pub struct Lab {
    exe: PathBuf,
    /// Built by the tester, so taken down by it.
    built: bool,
    /// Files of a namespace's /proc and /sys changed (namespace, path,
    /// contents before), to put back.
    changed: Vec<(&'static str, String, String)>,
    /// natrix's configuration as the lab wrote it (natrix labs only).
    pub natrix_config: Option<PathBuf>,
}

pub struct LabOptions<'a> {
    pub workers: u32,
    pub switch_napi: SwitchNapi,
    /// Queues of the device's interfaces, in a lab the tester builds.
    pub queues: u32,
    /// Frames each switch port towards the device buffers, in a lab the
    /// tester builds (0: none).
    pub port_buffer: u32,
    pub io: &'a str,
    pub workdir: &'a Path,
}

/// Refuses, before anything is measured, devices a lab `natrix lab up`
/// left cannot hold: it is measured as it was built, of one kind.
pub fn check_existing_lab(kinds: &[Kind]) -> Result<(), Failure> {
    if !lab_exists()? {
        return Ok(());
    }
    let found = existing_kind()?;
    match kinds.iter().find(|&&k| k != found) {
        Some(other) => Err(Failure::Other(format!(
            "the lab that is up holds {}; --dut {} needs the other kind: `natrix lab down` first (the tester then builds its own for each device)",
            found.name(),
            other.name()
        ))),
        None => Ok(()),
    }
}

impl Lab {
    pub fn prepare(kind: Kind, exe: &Path, opts: &LabOptions) -> Result<Lab, Failure> {
        let existing = lab_exists()?;
        let mut lab = Lab { exe: exe.to_owned(), built: !existing, changed: Vec::new(), natrix_config: None };
        if existing {
            check_existing_lab(&[kind])?;
            lab.natrix_config = (kind == Kind::Natrix).then(|| PathBuf::from(LAB_CONFIG));
            eprintln!("natrix test: a lab is up already and is measured as it was built (its queues and switch ports), whatever --queues and --port-buffer say; `natrix lab down` first for the tester to build its own");
        } else {
            let config = opts.workdir.join("lab.toml");
            let mut up = vec![
                "lab".to_owned(),
                "up".into(),
                "--config-out".into(),
                config.display().to_string(),
                "--workers".into(),
                opts.workers.to_string(),
                "--io".into(),
                opts.io.into(),
                "--queues".into(),
                opts.queues.to_string(),
                "--port-buffer".into(),
                opts.port_buffer.to_string(),
            ];
            if kind == Kind::Kernel {
                up.push("--kernel".into());
            }
            run(exe, &up)?;
            lab.natrix_config = (kind == Kind::Natrix).then_some(config);
        }
        match kind {
            Kind::Kernel => lab.prepare_kernel(opts.workers)?,
            Kind::Natrix => lab.steer_natrix_receive(opts.workers),
        }
        lab.steer_switch_receive(opts.workers);
        if opts.switch_napi == SwitchNapi::Lab {
            lab.switch_napi_on_lab_cpus(opts.workers)?;
        }
        Ok(lab)
    }

    /// conntrack timeouts as long as natrix's, and the NAT's receive work
    /// steered off the tester's CPU onto the device's CPUs (RPS), as
    /// natrix with as many workers runs on them; every receive queue's.
    fn prepare_kernel(&mut self, workers: u32) -> Result<(), Failure> {
        for (path, value) in KERNEL_UDP_TIMEOUTS {
            self.set(NAT_NS, path, value)?;
        }
        self.steer_device_receive(workers)
    }

    /// The device's links' receive work steered (RPS) to its CPUs.
    fn steer_device_receive(&mut self, workers: u32) -> Result<(), Failure> {
        self.steer_receive(NAT_NS, &DEVICE_LINKS, &dut_cpus(workers))
    }

    /// natrix's links' receive work on natrix's CPUs (RPS), as the
    /// kernel's, where they have no NAPI threads to put it there: generic
    /// XDP programs, or AF_PACKET. Native programs' frames never reach
    /// RPS. Best effort, said on stderr.
    fn steer_natrix_receive(&mut self, workers: u32) {
        if let Err(e) = self.steer_device_receive(workers) {
            eprintln!("natrix test: natrix's receive work is not (all) steered to its CPUs where its links have no NAPI threads: {e}");
        }
    }

    /// What the device sends, received in nx-sw and from there by the
    /// bridges, the hosts' stacks and the tester's ports, steered (RPS)
    /// off the device's CPUs (`lab_cpus`). Left alone it runs on the CPU
    /// that sent it, so the device's CPUs paid for the lab's receivers:
    /// in a TCP run the iperf3 server's stack and the switch took more of
    /// them than the kernel's forwarding did, for natrix and the kernel
    /// alike.
    /// Best effort, said on stderr: a kernel without RPS leaves the work
    /// where it runs. The switch's bridge-nf keys are turned off here too
    /// (`natrix lab up` does so), for a lab built before, or br_netfilter
    /// loaded since.
    fn steer_switch_receive(&mut self, workers: u32) {
        if let Err(e) = self.steer_receive(SWITCH_NS, &DEVICE_PEERS, &lab_cpus(workers)) {
            eprintln!("natrix test: the lab's receive work is not (all) steered off the device's CPUs: {e}");
        }
        for key in BRIDGE_FILTERING {
            if in_ns(SWITCH_NS, "cat", &[key]).is_ok() {
                if let Err(e) = self.set(SWITCH_NS, key, "0") {
                    eprintln!("natrix test: nx-sw's bridges still filter: {e}");
                }
            }
        }
    }

    /// The switch's NAPI for what the device sends threaded, on the lab's
    /// CPUs at the NAPI threads' priority (`SwitchNapi::Lab`). Asked for,
    /// it is done or the run refused. The threads' affinity and priority
    /// are not recorded to put back: writing `threaded` back ends them.
    fn switch_napi_on_lab_cpus(&mut self, workers: u32) -> Result<(), Failure> {
        let cpus = lab_cpus(workers);
        if cpus.is_empty() {
            return Err(Failure::Other("--switch-napi lab: one CPU, so the lab has none of its own for the switch's NAPI".into()));
        }
        if cpus == [0] {
            eprintln!("natrix test: --switch-napi lab: the lab's only CPU is the tester's CPU 0, where the switch's NAPI threads may starve behind the generator");
        }
        for peer in DEVICE_PEERS {
            self.set(SWITCH_NS, &format!("/sys/class/net/{peer}/threaded"), "1").map_err(|e| {
                Failure::Other(format!(
                    "--switch-napi lab: nx-sw's {peer} has no NAPI to thread, as its GRO is off (a lab left up by an older natrix?): `natrix lab down` and run again ({e})"
                ))
            })?;
        }
        match pin_napi_threads(&DEVICE_PEERS, &cpus).as_slice() {
            [] => Ok(()),
            failed => Err(Failure::Other(format!("--switch-napi lab: {}", failed.join("; ")))),
        }
    }

    /// Every receive queue of `devs` in `ns` steered to `cpus` (none: left as they are).
    fn steer_receive(&mut self, ns: &'static str, devs: &[&str], cpus: &[usize]) -> Result<(), Failure> {
        if cpus.is_empty() {
            return Ok(());
        }
        let mask = rps_mask(cpus);
        for dev in devs {
            let queues = in_ns(ns, "ls", &[&format!("/sys/class/net/{dev}/queues")])?;
            for queue in queues.split_whitespace().filter(|q| q.starts_with("rx-")) {
                self.set(ns, &format!("/sys/class/net/{dev}/queues/{queue}/rps_cpus"), &mask)?;
            }
        }
        Ok(())
    }

    /// Writes `value` to `path` in `ns`, remembering what it held.
    fn set(&mut self, ns: &'static str, path: &str, value: &str) -> Result<(), Failure> {
        let before = in_ns(ns, "cat", &[path])?.trim().to_owned();
        write_in(ns, path, value)?;
        self.changed.push((ns, path.to_owned(), before));
        Ok(())
    }

    /// The tester between nx-sub1 and nx-srv1, with the device in nx-nat.
    pub fn tester(&self, io: Io, notes: &mut Vec<String>) -> Result<Tester, Failure> {
        let flows = flow_space();
        let initiator = open_link(SUB1, (NAT_NS, "inside"), vec![AddrRange { first: flows.first_subscriber, count: flows.subscribers }], io, notes)?;
        let responder = open_link(SRV1, (NAT_NS, "outside"), vec![AddrRange::single(flows.server)], io, notes)?;
        Ok(Tester::new(initiator, responder, flows, Expect::NAT))
    }

    /// The tester between nx-sub1 and nx-sub2 across the access switch
    /// alone: the generator measured without a device in the way. Without
    /// `receiving`, nothing of the tester listens in nx-sub2 (whose kernel
    /// drops the frames), as when trafgen is measured on the same path.
    pub fn switch_tester(&self, io: Io, receiving: bool, notes: &mut Vec<String>) -> Result<Tester, Failure> {
        let flows = flow_space();
        let sub2_mac = mac_of(SUB2.0, "eth0")?;
        let initiator = open_link_to(SUB1, sub2_mac, vec![AddrRange { first: flows.first_subscriber, count: flows.subscribers }], io, notes)?;
        let responder = if receiving {
            open_link_to(SUB2, initiator.mac, vec![AddrRange::single(flows.server)], io, notes)?
        } else {
            Link { port: Box::new(Unconnected), mac: [0; 6], gateway_mac: [0; 6], answers_arp_for: Vec::new() }
        };
        Ok(Tester::new(initiator, responder, flows, Expect::SWITCH))
    }

    /// nx-sub1's eth0 transmit counter, for a generator the tester does not drive.
    pub fn sub1_tx_packets(&self) -> Result<u64, Failure> {
        in_ns(SUB1.0, "cat", &["/sys/class/net/eth0/statistics/tx_packets"])?.trim().parse().map_err(|_| Failure::Other("nx-sub1: unreadable tx_packets".into()))
    }

    pub fn sub1_ns(&self) -> &'static str {
        SUB1.0
    }

    pub fn sub2_mac(&self) -> Result<[u8; 6], Failure> {
        mac_of(SUB2.0, "eth0")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.built {
            let _ = run(&self.exe, &["lab".into(), "down".into()]);
            return;
        }
        // Last change first: a file set twice gets its first value back.
        for (ns, path, value) in self.changed.drain(..).rev() {
            let _ = write_in(ns, &path, &value);
        }
    }
}

/// The connections the tester uses: 16 subscribers, 64 destination ports
/// on one server, source ports from 1024 up.
pub fn flow_space() -> FlowSpace {
    FlowSpace { first_subscriber: u32::from(FIRST_SUBSCRIBER), subscribers: SUBSCRIBERS, first_sport: 1024, server: u32::from(SERVER), first_dport: 5001, dports: DPORTS }
}

pub fn subscribers() -> Vec<Ipv4Addr> {
    (0..SUBSCRIBERS).map(|i| Ipv4Addr::from(u32::from(FIRST_SUBSCRIBER) + i)).collect()
}

/// The CPUs the device under test runs on, off the tester's CPU 0: one
/// per worker from CPU 1 on, natrix's or (for the kernel, as many) its
/// receive work's. A host with fewer CPUs gives what it has past CPU 0,
/// which the workers then share; a host with one CPU gives none, and
/// everything shares it.
pub fn dut_cpus(workers: u32) -> Vec<usize> {
    dut_cpus_of(workers, available_cpus())
}

fn dut_cpus_of(workers: u32, available: usize) -> Vec<usize> {
    (1..available).take(workers.max(1) as usize).collect()
}

/// The CPUs of the lab's own receivers (`steer_switch_receive`): those
/// after the device's where the host has them, else the tester's CPU 0;
/// none on a host of one CPU, where everything shares it.
fn lab_cpus(workers: u32) -> Vec<usize> {
    lab_cpus_of(workers, available_cpus())
}

fn lab_cpus_of(workers: u32, available: usize) -> Vec<usize> {
    let Some(&last) = dut_cpus_of(workers, available).last() else { return Vec::new() };
    let after: Vec<usize> = (last + 1..available).collect();
    if after.is_empty() {
        vec![0]
    } else {
        after
    }
}

/// Where one iperf3 server and its client run in the TCP test: each on a
/// CPU of the lab's own past the device's, where the host has them; else
/// (None) on the tester's CPU 0 with the rest of the lab. Sharing one
/// CPU, the two hosts' copies of every byte limit TCP before the device
/// does.
pub struct IperfCpus {
    pub server: Option<usize>,
    pub client: Option<usize>,
}

/// The CPUs of `streams` iperf3 pairs: the first pair's server on the
/// lab's last CPU and its client on the one before, the next pair's on
/// the two before those, and so on while there are CPUs.
pub fn iperf_cpus(workers: u32, streams: u32) -> Vec<IperfCpus> {
    iperf_cpus_of(workers, available_cpus(), streams)
}

fn iperf_cpus_of(workers: u32, available: usize, streams: u32) -> Vec<IperfCpus> {
    let mut own = lab_cpus_of(workers, available).into_iter().filter(|&c| c != 0).rev();
    (0..streams).map(|_| IperfCpus { server: own.next(), client: own.next() }).collect()
}

/// A namespace's /proc/net/dev, opened in it once and read again without
/// starting a program on the lab's CPU.
struct NetDev(File);

impl NetDev {
    fn open(ns: &str) -> Option<NetDev> {
        in_netns(ns, || File::open("/proc/thread-self/net/dev")).ok()?.ok().map(NetDev)
    }

    fn text(&mut self) -> Option<String> {
        let mut text = String::new();
        self.0.seek(SeekFrom::Start(0)).ok()?;
        self.0.read_to_string(&mut text).ok()?;
        Some(text)
    }
}

/// nx-sw's interface counters, for the frames the device sends into the
/// lab, sampled while TCP runs.
pub struct SwitchCounters(NetDev);

impl SwitchCounters {
    pub fn open() -> Option<SwitchCounters> {
        NetDev::open(SWITCH_NS).map(SwitchCounters)
    }

    /// Frames the device has sent so far: what nx-sw's peers of its two
    /// links received.
    pub fn device_frames(&mut self) -> Option<u64> {
        let text = self.0.text()?;
        DEVICE_PEERS.iter().map(|dev| dev_counter(&text, dev, RX_PACKETS)).sum()
    }
}

/// Frames lost at the device's edges, as veth counts them: a frame its
/// peer's queue refused (a full ring, a full backlog, a failed XDP
/// redirect) is a transmit drop of the sender. Each direction is counted
/// at its sender alone, the same way for natrix and the kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EdgeDrops {
    /// The switch could not hand them to the device: its receive queue was full.
    pub into_device: u64,
    /// The device could not hand them to the switch, sent or redirected by XDP.
    pub out_of_device: u64,
}

impl EdgeDrops {
    /// The counts so far; None where /proc/net/dev could not be read.
    pub fn read() -> Option<EdgeDrops> {
        let switch = NetDev::open(SWITCH_NS)?.text()?;
        let nat = NetDev::open(NAT_NS)?.text()?;
        EdgeDrops::from_counters(&switch, &nat)
    }

    /// From /proc/net/dev as read in nx-sw (`switch`) and in nx-nat (`nat`).
    fn from_counters(switch: &str, nat: &str) -> Option<EdgeDrops> {
        Some(EdgeDrops { into_device: tx_drops(switch, &DEVICE_PEERS)?, out_of_device: tx_drops(nat, &DEVICE_LINKS)? })
    }

    /// What was dropped between `before` and `self`.
    pub fn since(&self, before: &EdgeDrops) -> EdgeDrops {
        EdgeDrops { into_device: self.into_device.saturating_sub(before.into_device), out_of_device: self.out_of_device.saturating_sub(before.out_of_device) }
    }
}

/// Frames each receive queue of the device's links took, by veth's XDP
/// counters (`ethtool -S`, `rx_queue_N_xdp_packets`): what the device's
/// XDP program saw, so natrix's frames, offloaded or not; veth counts
/// only for native programs, so the counts stay zero for the kernel,
/// which runs none there, and for natrix's generic ones.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueFrames(Vec<Vec<u64>>);

impl QueueFrames {
    /// The counts so far, per link of `DEVICE_LINKS`; None where ethtool
    /// could not read them.
    pub fn read() -> Option<QueueFrames> {
        let read = |dev: &&str| in_ns(NAT_NS, "ethtool", &["-S", dev]).ok().map(|stats| xdp_packets_by_queue(&stats));
        DEVICE_LINKS.iter().map(read).collect::<Option<Vec<_>>>().map(QueueFrames)
    }

    /// What each queue took between `before` and `self`, by link name;
    /// None where no queue took any (no native XDP program).
    pub fn since(&self, before: &QueueFrames) -> Option<Vec<(&'static str, Vec<u64>)>> {
        let grown: Vec<Vec<u64>> = self.0.iter().zip(&before.0).map(|(now, then)| now.iter().zip(then).map(|(n, t)| n.saturating_sub(*t)).collect()).collect();
        grown.iter().flatten().any(|&n| n > 0).then(|| DEVICE_LINKS.into_iter().zip(grown).collect())
    }
}

/// `rx_queue_N_xdp_packets` of `ethtool -S`'s `stats`, in queue order.
fn xdp_packets_by_queue(stats: &str) -> Vec<u64> {
    let mut queues: Vec<(usize, u64)> = stats
        .lines()
        .filter_map(|line| {
            let (name, value) = line.trim().split_once(':')?;
            let queue = name.strip_prefix("rx_queue_")?.strip_suffix("_xdp_packets")?.parse().ok()?;
            Some((queue, value.trim().parse().ok()?))
        })
        .collect();
    queues.sort_unstable();
    queues.into_iter().map(|(_, n)| n).collect()
}

/// The transmit drops of `devs` together, from /proc/net/dev's `text`.
fn tx_drops(text: &str, devs: &[&str]) -> Option<u64> {
    devs.iter().map(|dev| dev_counter(text, dev, TX_DROP)).sum()
}

/// Columns of /proc/net/dev after an interface's name: received packets,
/// and transmit drops (the receive columns come first, eight of them).
const RX_PACKETS: usize = 1;
const TX_DROP: usize = 11;

/// `dev`'s counter in `column` of /proc/net/dev's `text`.
fn dev_counter(text: &str, dev: &str, column: usize) -> Option<u64> {
    let line = text.lines().find_map(|l| l.trim_start().strip_prefix(dev)?.strip_prefix(':'))?;
    line.split_whitespace().nth(column)?.parse().ok()
}

/// `cpus` as `rps_cpus` takes them: hexadecimal 32-bit groups, the
/// highest first, separated by commas.
fn rps_mask(cpus: &[usize]) -> String {
    let mut groups = vec![0u32; cpus.iter().max().map_or(1, |&c| c / 32 + 1)];
    for &c in cpus {
        groups[c / 32] |= 1 << (c % 32);
    }
    groups.iter().rev().map(|g| format!("{g:08x}")).collect::<Vec<_>>().join(",")
}

/// `cpus` as a `cpu_set_t`.
pub fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data, all zeroes a valid empty set;
    // CPU_SET writes inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        set
    }
}

/// CPUs online, whatever this thread's own affinity (the tester pins
/// itself to CPU 0).
fn available_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// A tester port in `host`'s namespace on its eth0, sending to the
/// device's interface `gateway` (its MAC read in nx-nat).
fn open_link(host: (&str, Ipv4Addr), gateway: (&str, &str), answers: Vec<AddrRange>, io: Io, notes: &mut Vec<String>) -> Result<Link, Failure> {
    let gateway_mac = mac_of(gateway.0, gateway.1)?;
    open_link_to(host, gateway_mac, answers, io, notes)
}

fn open_link_to(host: (&str, Ipv4Addr), gateway_mac: [u8; 6], mut answers: Vec<AddrRange>, io: Io, notes: &mut Vec<String>) -> Result<Link, Failure> {
    let (ns, own) = host;
    let opened = in_netns(ns, || ports::open("eth0", io)).map_err(|e| Failure::Other(format!("{ns}: {e}")))?.map_err(|e| Failure::Other(format!("{ns}: {e}")))?;
    if let Some(why) = opened.fallback {
        notes.push(format!("{ns}: {why}"));
    }
    // The port takes the host's frames too: answer ARP for the host.
    answers.push(AddrRange::single(u32::from(own)));
    Ok(Link { port: opened.port, mac: opened.mac, gateway_mac, answers_arp_for: answers })
}

fn mac_of(ns: &str, dev: &str) -> Result<[u8; 6], Failure> {
    let found = in_netns(ns, || Interface::lookup(dev)).map_err(|e| Failure::Other(format!("{ns}: {e}")))?;
    found.map(|i| i.mac).map_err(|e| Failure::Other(format!("{ns}: {e}")))
}

fn lab_exists() -> Result<bool, Failure> {
    let listing = command("ip", &["netns", "list"])?;
    Ok(listing.lines().filter_map(|l| l.split_whitespace().next()).any(|n| n.starts_with("nx-")))
}

/// A kernel lab forwards in nx-nat; natrix's does not (natrix owns the interfaces).
fn existing_kind() -> Result<Kind, Failure> {
    let forwarding = in_ns(NAT_NS, "sysctl", &["-n", "net.ipv4.ip_forward"])?;
    Ok(if forwarding.trim() == "1" { Kind::Kernel } else { Kind::Natrix })
}

/// Threaded NAPI on nx-nat's links, the NAPI threads on `cpus` at a
/// real-time priority: with AF_XDP, veth runs the XDP program that hands
/// natrix a frame, and copies it, in the NAPI of the CPU that sent it (the
/// tester's); in threads of their own that work follows natrix to its CPU,
/// as RPS moves the kernel's receive work for the kernel's run. veth has
/// NAPI only while an XDP program is attached, so this runs once natrix is
/// up; the setting outlives natrix harmlessly (a threaded NAPI where there
/// is one).
///
/// The priority is a NIC's: its receive work runs in softirq, ahead of
/// any thread, as the kernel's forwarding does here, and threaded
/// interrupt handlers run at SCHED_FIFO 50. At the scheduler's ordinary
/// priority a NAPI thread waited behind natrix's polling worker (nice
/// -10, `sys::NICE`) until veth's 256-frame ring overflowed: one worker
/// lost 64-byte frames from 66-157 kpps on the 2-CPU lab, and from
/// 209-250 kpps (near the generator's limit there) at SCHED_FIFO 50.
///
/// Returns what could not be done, one line per thread, for the run's notes.
pub fn napi_on_cpus(cpus: &[usize]) -> Vec<String> {
    let mut failed = Vec::new();
    for dev in DEVICE_LINKS {
        if let Err(e) = write_in_nat(&format!("/sys/class/net/{dev}/threaded"), "1") {
            failed.push(format!("{dev}: no threaded NAPI, so its receive work runs on the CPU that sends to it: {e}"));
        }
    }
    failed.extend(pin_napi_threads(&DEVICE_LINKS, cpus));
    failed
}

/// Whether nx-nat's `inside` runs a native XDP program (`ip` shows
/// `xdp`; a generic one shows `xdpgeneric`, AF_PACKET none); None where
/// `ip` fails.
pub fn links_run_native_xdp() -> Option<bool> {
    in_ns(NAT_NS, "ip", &["-d", "link", "show", DEVICE_LINKS[0]]).ok().map(|shown| shown.split_whitespace().any(|word| word == "xdp"))
}

/// Pins the NAPI threads of `devs` to `cpus` at SCHED_FIFO
/// `NAPI_PRIORITY`; returns what could not be done, one line each.
fn pin_napi_threads(devs: &[&str], cpus: &[usize]) -> Vec<String> {
    let mut failed = Vec::new();
    let set = cpu_set(cpus);
    let fifo = libc::sched_param { sched_priority: NAPI_PRIORITY };
    for dev in devs {
        let threads = napi_threads_of(&[dev]);
        if threads.is_empty() {
            failed.push(format!("no NAPI threads of {dev} found to pin to CPUs {cpus:?}"));
        }
        for pid in threads {
            // SAFETY: set is a live cpu_set_t of the size given.
            if unsafe { libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
                failed.push(format!("NAPI thread {pid} of {dev} not pinned to CPUs {cpus:?}: {}", std::io::Error::last_os_error()));
            }
            // SAFETY: fifo is a live sched_param.
            if unsafe { libc::sched_setscheduler(pid, libc::SCHED_FIFO, &fifo) } != 0 {
                failed.push(format!("NAPI thread {pid} of {dev} left at its priority, not SCHED_FIFO {NAPI_PRIORITY}: {}", std::io::Error::last_os_error()));
            }
        }
    }
    failed
}

/// SCHED_FIFO priority of the NAPI threads: the kernel's for threaded
/// interrupt handlers.
const NAPI_PRIORITY: libc::c_int = 50;

/// The NAPI threads of nx-nat's links (threaded NAPI), by their names.
pub fn napi_threads() -> Vec<libc::pid_t> {
    napi_threads_of(&DEVICE_LINKS)
}

/// The NAPI threads of the interfaces named `devs`, in any namespace:
/// the kernel names them "napi/DEV-ID", cut to 15 characters. The lab's
/// names are its own; another namespace's interfaces of the same names
/// would have their threads counted too.
fn napi_threads_of(devs: &[&str]) -> Vec<libc::pid_t> {
    let prefixes: Vec<String> = devs.iter().map(|dev| format!("napi/{dev}-").chars().take(15).collect()).collect();
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    procs
        .flatten()
        .filter_map(|p| {
            let pid = p.file_name().to_str()?.parse::<libc::pid_t>().ok()?;
            let comm = std::fs::read_to_string(p.path().join("comm")).ok()?;
            prefixes.iter().any(|prefix| comm.starts_with(prefix.as_str())).then_some(pid)
        })
        .collect()
}

/// Writes a /proc or /sys file of nx-nat.
fn write_in_nat(path: &str, value: &str) -> Result<(), Failure> {
    write_in(NAT_NS, path, value)
}

/// Writes a /proc or /sys file as seen from `ns` (`ip netns exec` mounts
/// that namespace's /sys).
fn write_in(ns: &str, path: &str, value: &str) -> Result<(), Failure> {
    in_ns(ns, "sh", &["-c", "echo \"$1\" > \"$2\"", "sh", value, path]).map(drop)
}

fn run(exe: &Path, args: &[String]) -> Result<(), Failure> {
    let out = Command::new(exe).args(args).stdin(Stdio::null()).output().map_err(|e| Failure::Other(format!("{}: {e}", exe.display())))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Failure::Other(format!("`natrix {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())))
}

fn in_ns(ns: &str, program: &str, args: &[&str]) -> Result<String, Failure> {
    let full: Vec<&str> = ["netns", "exec", ns, program].into_iter().chain(args.iter().copied()).collect();
    command("ip", &full)
}

fn command(program: &str, args: &[&str]) -> Result<String, Failure> {
    let out = Command::new(program).args(args).stdin(Stdio::null()).output().map_err(|e| Failure::Other(format!("cannot run {program}: {e}")))?;
    if !out.status.success() {
        return Err(Failure::Other(format!("`{program} {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lab_receives_off_the_device_cpus_and_the_tester_cpu_where_it_can() {
        // 16 CPUs: the tester on 0, two workers on 1-2, the lab on the rest.
        assert_eq!(dut_cpus_of(2, 16), vec![1, 2]);
        assert_eq!(lab_cpus_of(2, 16), (3..16).collect::<Vec<_>>());
        // 2 CPUs: nothing is left after the device's CPU 1 but the tester's.
        assert_eq!(lab_cpus_of(1, 2), vec![0]);
        assert_eq!(lab_cpus_of(4, 3), vec![0]);
        // 1 CPU: everything shares it, and nothing is steered.
        assert!(dut_cpus_of(1, 1).is_empty() && lab_cpus_of(1, 1).is_empty());
    }

    #[test]
    fn iperf3s_hosts_get_lab_cpus_of_their_own_where_there_are_any() {
        let at = |workers, available| {
            let c = &iperf_cpus_of(workers, available, 1)[0];
            (c.server, c.client)
        };
        assert_eq!(at(1, 16), (Some(15), Some(14)));
        assert_eq!(at(2, 4), (Some(3), None));
        // 2 CPUs, or a device that takes every CPU past 0: the tester's CPU 0.
        assert_eq!(at(1, 2), (None, None));
        assert_eq!(at(4, 3), (None, None));
        assert_eq!(at(1, 1), (None, None));
    }

    #[test]
    fn each_iperf3_pair_gets_lab_cpus_of_its_own_while_there_are_any() {
        let pairs = |workers, available, streams| iperf_cpus_of(workers, available, streams).iter().map(|c| (c.server, c.client)).collect::<Vec<_>>();
        assert_eq!(pairs(2, 16, 3), vec![(Some(15), Some(14)), (Some(13), Some(12)), (Some(11), Some(10))]);
        // 6 CPUs, two workers: the lab has 3-5, so the second pair's client shares CPU 0.
        assert_eq!(pairs(2, 6, 2), vec![(Some(5), Some(4)), (Some(3), None)]);
        assert_eq!(pairs(1, 2, 2), vec![(None, None), (None, None)]);
    }

    #[test]
    fn each_queues_xdp_frames_are_read_in_queue_order() {
        let stats = "NIC statistics:\n     peer_ifindex: 4\n     rx_queue_1_xdp_packets: 5\n     rx_queue_1_xdp_bytes: 424\n\
                     rx_queue_0_xdp_packets: 4\n     rx_queue_0_xdp_redirect: 4\n     tx_queue_0_xdp_xmit: 9\n";
        assert_eq!(xdp_packets_by_queue(stats), vec![4, 5]);
        let before = QueueFrames(vec![vec![4, 5], vec![1, 1]]);
        let after = QueueFrames(vec![vec![10, 5], vec![1, 3]]);
        assert_eq!(after.since(&before), Some(vec![(DEVICE_LINKS[0], vec![6, 0]), (DEVICE_LINKS[1], vec![0, 2])]));
        assert_eq!(before.since(&before), None, "no program, no counts: nothing to report");
    }

    #[test]
    fn interface_counters_are_read_by_name_and_column() {
        let dev = "Inter-|   Receive                            |  Transmit\n face |bytes    packets errs drop\n\
                   nx-nat-in: 1500 12 0 4 0 0 0 0 900 7 0 9 0 0 0 0\n\
                   nx-nat-out:99000 66 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
        assert_eq!(dev_counter(dev, "nx-nat-in", RX_PACKETS), Some(12));
        assert_eq!(dev_counter(dev, "nx-nat-out", RX_PACKETS), Some(66));
        assert_eq!(dev_counter(dev, "nx-nat-in", TX_DROP), Some(9));
        assert_eq!(dev_counter(dev, "nx-nat", RX_PACKETS), None);
    }

    /// /proc/net/dev as the kernel writes it ("%6s: %7llu ..."): names
    /// right-aligned in six columns, longer ones from the line's start.
    const SWITCH_DEV: &str = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
nx-nat-in: 2685808   45611    0    3    0     0          0         0 2673430775 1782446    0 59744    0     0       0          0
nx-nat-out: 2264566524 1495857    0    0    0     0          0         0  2685808   45600    0  488    0     0       0          0
nx-sub1: 9000     100    0    0    0     0          0         0     9000     100    0    7    0     0       0          0
";
    const NAT_DEV: &str = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
inside: 2673430775 1782446    0   11    0     0          0         0  2685808   45611    0    2    0     0       0          0
outside: 2685808   45600    0    0    0     0          0         0 2264566524 1495857    0   40    0     0       0          0
";

    #[test]
    fn each_direction_is_counted_at_its_sender_alone() {
        // Into the device: nx-sw's ends of its links; out of it: its own
        // links. Receive drops and other interfaces count nowhere.
        let drops = EdgeDrops::from_counters(SWITCH_DEV, NAT_DEV).unwrap();
        assert_eq!(drops, EdgeDrops { into_device: 59744 + 488, out_of_device: 2 + 40 });
        // A link missing from either file: no count rather than a wrong one.
        assert_eq!(EdgeDrops::from_counters(SWITCH_DEV, &NAT_DEV.replace("outside:", "other:")), None);
    }

    #[test]
    fn drops_since_a_reading_are_the_differences() {
        let before = EdgeDrops { into_device: 10, out_of_device: 5 };
        let after = EdgeDrops { into_device: 25, out_of_device: 5 };
        assert_eq!(after.since(&before), EdgeDrops { into_device: 15, out_of_device: 0 });
    }

    #[test]
    fn rps_masks_are_32_bit_groups_highest_first() {
        assert_eq!(rps_mask(&[1]), "00000002");
        assert_eq!(rps_mask(&[1, 2]), "00000006");
        assert_eq!(rps_mask(&[31, 32, 33]), "00000003,80000000");
        assert_eq!(rps_mask(&[64]), "00000001,00000000,00000000");
    }
}
