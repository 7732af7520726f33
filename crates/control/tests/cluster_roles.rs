//! Two cluster nodes over loopback UDP, each on a dataplane of its own over
//! in-memory ports: roles settle on the configured active node, its
//! events reach the standby's tables, the standby takes over when the
//! active node stops, and a restarted configured-active node finds its
//! partner active and stays standby (no preemption).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use natrix_control::cluster::node::{ClusterNode, NodeSettings};
use natrix_control::config::cluster::{ClusterConfig, Role, SyncConfig};
use natrix_dataplane::{Dataplane, DeviceDeferral, IoChoice, LinkSettings, Offloading, Settings, StartOptions, SuppliedPort, XdpAttach};
use natrix_engine::{EngineConfig, Event, EventKind, Proto};
use natrix_io::{MemoryPeer, MemoryPort};

const POOL: u32 = 0xcb00_7101;

fn dataplane() -> Arc<Dataplane> {
    dataplane_with_inside().0
}

/// A dataplane and the subscribers' end of its inside link.
fn dataplane_with_inside() -> (Arc<Dataplane>, MemoryPeer) {
    let (inside, peer) = MemoryPort::pair().unwrap();
    let (outside, _) = MemoryPort::pair().unwrap();
    let engine = EngineConfig { inside_addr: 0x6440_0001, inside_prefix_len: 10, outside_addr: Some(0xc633_6401), pool: vec![POOL], log_sessions: true, ..EngineConfig::default() };
    let settings = Settings {
        engine,
        inside: LinkSettings { interface: "memory-in".into(), addr: 0x6440_0001, prefix_len: 10 },
        outside: LinkSettings { interface: "memory-out".into(), addr: 0xc633_6401, prefix_len: 24 },
        gateway: None,
        workers: 1,
        io: IoChoice::Auto,
        busy_poll: false,
        prefer_busy_poll: DeviceDeferral::Off,
        offload: Offloading::Off,
        xdp_mode: XdpAttach::Auto,
        event_buffer: 1024,
    };
    let ports = [SuppliedPort { port: Box::new(inside), mac: [2, 0, 0, 0, 0, 1], mtu: 1500 }, SuppliedPort { port: Box::new(outside), mac: [2, 0, 0, 0, 0, 2], mtu: 1500 }];
    (Arc::new(Dataplane::start_with(settings, StartOptions { gateway6: None, ports: Some(ports) }).unwrap()), peer)
}

fn node(name: &str, role: Role, listen: SocketAddr, peer: SocketAddr, dp: Arc<Dataplane>) -> ClusterNode {
    let cluster = ClusterConfig {
        node: name.into(),
        partition: "p1".into(),
        role,
        subscribers: vec![(0x6440_0000, 24)],
        subscriber_space: vec![(0x6440_0000, 24)],
        pool_space: vec![(POOL, 32)],
        sync: Some(SyncConfig { listen, peer }),
        peer_timeout_ms: 200,
        bgp: None,
    };
    // Loopback's operstate says "unknown": up, so the node may take over.
    let settings = NodeSettings { cluster, interfaces: ["lo".into(), "lo".into()], routes: Vec::new(), run_dir: std::env::temp_dir() };
    ClusterNode::start(settings, dp).unwrap()
}

fn wait(what: &str, pred: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if pred() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("not within 5 s: {what}");
}

fn free_port() -> SocketAddr {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[test]
fn roles_settle_state_flows_the_standby_takes_over_and_nobody_preempts() {
    let (a_addr, b_addr) = (free_port(), free_port());
    let (a_dp, b_dp) = (dataplane(), dataplane());
    let a = node("a", Role::Active, a_addr, b_addr, a_dp.clone());
    let b = node("b", Role::Standby, b_addr, a_addr, b_dp.clone());
    wait("a active, b standby", || a.status().role == "active" && b.status().role == "standby" && b.status().peer_heard_ms_ago.is_some());
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(b.status().role, "standby", "the standby stays standby while it hears the active node");

    let mapping = Event {
        kind: EventKind::MappingCreated,
        time_ns: 0,
        proto: Proto::Udp,
        int_addr: 0x6440_0005,
        int_port: 4000,
        ext_addr: POOL,
        ext_port: 31000,
        ext_port_end: 31000,
        rem_addr: 0,
        rem_port: 0,
        b4: None,
    };
    a.tee().send(&mapping);
    wait("the standby installs the mapping", || b_dp.mappings(Default::default(), usize::MAX).unwrap().len() == 1);
    let m = b_dp.mappings(Default::default(), usize::MAX).unwrap()[0];
    assert_eq!((m.int_addr, m.int_port, m.ext_addr, m.ext_port), (0x6440_0005, 4000, POOL, 31000));
    wait("acknowledged", || a.status().records_acked == 1 && a.status().lag_records == 0);
    // The status is published every 100 ms.
    wait("b's status counts the record", || {
        let st = b.status();
        (st.records_received, st.records_installed, st.records_lost) == (1, 1, 0)
    });

    a.stop();
    let stopped = Instant::now();
    wait("b takes over", || b.status().role == "active");
    assert!(stopped.elapsed() < Duration::from_millis(1500), "took {:?}", stopped.elapsed());
    assert_eq!(b.status().role_changes, 1);

    // a comes back, configured active: b is active, so a stays standby.
    let a = node("a", Role::Active, a_addr, b_addr, a_dp);
    wait("a hears b", || a.status().peer_heard_ms_ago.is_some());
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!((a.status().role, b.status().role), ("standby", "active"));
    a.stop();
    b.stop();
}

/// Node a, active alone, holding a mapping and a session a subscriber's
/// datagram made (translated, then dropped for want of a route: no
/// gateway here). No logger feeds a's events to its tee, so nothing of
/// this is streamed: only a resync can bring it to a standby.
fn active_with_a_mapping(a_addr: SocketAddr, b_addr: SocketAddr) -> (ClusterNode, Arc<Dataplane>) {
    let (a_dp, subscribers) = dataplane_with_inside();
    let a = node("a", Role::Active, a_addr, b_addr, a_dp.clone());
    wait("a takes the active role alone", || a.status().role == "active");
    let mut frame = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 1, 5], [2, 0, 0, 0, 0, 1]).ipv4([100, 64, 0, 5], [192, 0, 2, 53], 64).udp(4000, 53).write(&mut frame, b"q").unwrap();
    subscribers.inject(&frame);
    wait("a holds the mapping", || a_dp.mappings(Default::default(), usize::MAX).unwrap().len() == 1);
    (a, a_dp)
}

/// A standby that starts after its partner asks for a resync and gets the
/// state the active node made before it was there.
#[test]
fn a_standby_that_starts_late_is_given_the_state_made_before() {
    let (a_addr, b_addr) = (free_port(), free_port());
    let (a, a_dp) = active_with_a_mapping(a_addr, b_addr);
    let made = a_dp.mappings(Default::default(), usize::MAX).unwrap()[0];

    let b_dp = dataplane();
    let b = node("b", Role::Standby, b_addr, a_addr, b_dp.clone());
    wait("b installs a's earlier mapping and session", || {
        b_dp.mappings(Default::default(), usize::MAX).unwrap().len() == 1 && b_dp.sessions(Default::default(), usize::MAX).unwrap().len() == 1
    });
    let got = b_dp.mappings(Default::default(), usize::MAX).unwrap()[0];
    assert_eq!((got.int_addr, got.int_port, got.ext_addr, got.ext_port), (made.int_addr, made.int_port, made.ext_addr, made.ext_port));
    assert_eq!(b.status().role, "standby");
    b.stop();
    a.stop();
}

/// A standby's RESYNC is a datagram, which may be lost: it asks again, and
/// the active node answers once. Here everything the standby sends in the
/// first 300 ms after its first datagram is lost on the way.
#[test]
fn a_standby_whose_first_resync_is_lost_asks_again_and_gets_the_state() {
    let (a_addr, b_addr) = (free_port(), free_port());
    let relay = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let relay_addr = relay.local_addr().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let relaying = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            relay.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let (mut buf, mut first) = ([0u8; 2048], None::<Instant>);
            let mut lost = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(n) = relay.recv(&mut buf) else { continue };
                if first.get_or_insert_with(Instant::now).elapsed() < Duration::from_millis(300) {
                    lost += 1;
                    continue;
                }
                let _ = relay.send_to(&buf[..n], a_addr);
            }
            lost
        })
    };
    let (a, _) = active_with_a_mapping(a_addr, b_addr);

    let b_dp = dataplane();
    let b = node("b", Role::Standby, b_addr, relay_addr, b_dp.clone());
    wait("b installs a's mapping and session all the same", || {
        b_dp.mappings(Default::default(), usize::MAX).unwrap().len() == 1 && b_dp.sessions(Default::default(), usize::MAX).unwrap().len() == 1
    });
    b.stop();
    a.stop();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(relaying.join().unwrap() >= 1, "the first RESYNC was lost");
}
