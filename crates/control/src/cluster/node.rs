//! A cluster node at run time, on a thread of its own beside the dataplane:
//! the session sync transport (UDP to and from its partner, over the
//! `sync::window` rules), its role (active or standby) and the BGP
//! speaker's announcements. Nothing here is on the packet path: the
//! workers' events reach it through the logger's bounded tee, and what it
//! installs reaches the workers through their command channels.
//!
//! Roles, with sync configured: every node starts as standby and listens.
//! A node that hears nothing from an active partner for `peer_timeout`
//! (three times that at start for a node configured standby, so a pair
//! started together settles on the configured active) becomes active: it
//! announces at the preferred path length and streams its NAT events to
//! its partner, which installs them. An active node that hears another
//! active partner yields if it is configured standby (no preemption: a
//! restarted configured-active node finds its partner active and stays
//! standby). An active node that loses an interface falls silent and
//! becomes standby, so its partner takes over; a node that cannot forward
//! never takes over. Without sync, a node keeps its configured role.
//!
//! A standby that hears an active session for the first time (it started,
//! or its partner did) asks for a resync: the active node's workers walk
//! their tables between batches while this thread goes on with its
//! heartbeats, and it streams every mapping and session, then the events
//! made meanwhile, as the window drains.
//!
//! Announcements follow forwarding: while both interfaces are up, the
//! node's prefixes (prepended when standby, and once when a configured
//! standby has taken over, so that two active nodes never share a
//! partition's traffic); when either goes down, none.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use natrix_dataplane::Dataplane;
use natrix_engine::{Event, EventKind};
use serde::Serialize;
use tracing::{error, info, warn};

use super::bgp::{Announcement, Speaker};
use super::sync::window::{Limits, Receiver as SyncReceiver, Sender as SyncSender_};
use super::sync::wire::{Message, Record};
use crate::config::cluster::{ClusterConfig, Prefix4, Role};

/// How often the node looks at its socket, events and timers.
const TICK: Duration = Duration::from_millis(2);
/// How often interfaces are checked and announcements brought up to date.
const HEALTH_EVERY: Duration = Duration::from_millis(100);
/// RESYNC requests a standby sends for one active session, this far apart;
/// the active partner takes those within `RESYNC_REPEATED_WITHIN` of the
/// first as that one.
const RESYNC_ASKS: u32 = 3;
const RESYNC_ASK_EVERY: Duration = Duration::from_millis(500);
const RESYNC_REPEATED_WITHIN: Duration = Duration::from_secs(5);
/// How often a BIRD that keeps exiting is started again.
const BIRD_RESTART_EVERY: Duration = Duration::from_secs(2);
/// Events waiting between the logger and this thread; past it they are
/// counted as lost to sync rather than wait.
const TEE_CAPACITY: usize = 1 << 16;
/// The sync window: 4096 messages of up to 57 records (about 5.6 MB)
/// unacknowledged at most; resent after 200 ms, five tries; a partial
/// batch waits 5 ms; ALIVE every 100 ms when idle.
const LIMITS: Limits = Limits { max_pending: 4096, retransmit_ns: 200_000_000, max_tries: 5, flush_ns: 5_000_000, keepalive_ns: 100_000_000 };

/// What the node runs with, besides its `[cluster]` section.
pub struct NodeSettings {
    pub cluster: ClusterConfig,
    /// The inside and outside interfaces whose state decides announcements.
    pub interfaces: [String; 2],
    /// What to announce at start (pool via outside, default via inside).
    pub routes: Vec<(Prefix4, std::net::Ipv4Addr)>,
    /// Where BIRD's files go.
    pub run_dir: PathBuf,
}

/// The node as `natrix show cluster` and the metrics see it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClusterStatus {
    pub node: String,
    pub partition: String,
    pub configured_role: &'static str,
    pub role: &'static str,
    /// Seconds in the current role.
    pub role_seconds: f64,
    pub role_changes: u64,
    pub peer: Option<String>,
    /// Milliseconds since the active partner was last heard (standby), or
    /// since the standby last acknowledged (active); None: never.
    pub peer_heard_ms_ago: Option<u64>,
    /// Records not yet acknowledged by the standby (active): the sync lag.
    pub lag_records: u64,
    pub records_sent: u64,
    pub records_acked: u64,
    /// Records the active node gave up (window full or never acknowledged),
    /// plus those that found the tee full.
    pub records_given_up: u64,
    pub retransmits: u64,
    pub records_received: u64,
    /// Records the standby never got (exact, from the sequence of record counts).
    pub records_lost: u64,
    pub records_installed: u64,
    /// Records the engine refused to install (conflict, pool mismatch, tables full).
    pub records_refused: u64,
    pub datagrams_refused: u64,
    pub announcing: bool,
    pub interfaces_up: bool,
    pub bgp_error: Option<String>,
}

/// The running node: its thread, its status and the tee the logger feeds.
pub struct ClusterNode {
    tee: EventTee,
    status: Arc<Mutex<ClusterStatus>>,
    /// The routes a reload hands the node (its pool changed), taken at its
    /// next announcement.
    new_routes: Arc<Mutex<Option<Routes>>>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

type Routes = Vec<(Prefix4, std::net::Ipv4Addr)>;

/// Where the logger hands every event; never blocks.
#[derive(Clone)]
pub struct EventTee {
    tx: SyncSender<Event>,
    dropped: Arc<AtomicU64>,
}

impl EventTee {
    pub fn send(&self, e: &Event) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(*e) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl ClusterNode {
    pub fn start(settings: NodeSettings, dp: Arc<Dataplane>) -> Result<ClusterNode, String> {
        let socket = match settings.cluster.sync {
            Some(s) => Some(bind(s.listen)?),
            None => None,
        };
        let (tx, rx) = mpsc::sync_channel(TEE_CAPACITY);
        let dropped = Arc::new(AtomicU64::new(0));
        let status = Arc::new(Mutex::new(ClusterStatus::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let new_routes = Arc::new(Mutex::new(None));
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = {
            let (status, stop, dropped, new_routes) = (status.clone(), stop.clone(), dropped.clone(), new_routes.clone());
            std::thread::Builder::new()
                .name("natrix-cluster".into())
                .spawn(move || {
                    // BIRD is this thread's child, so that it dies with the thread (and natrix).
                    let speaker = match &settings.cluster.bgp {
                        Some(b) => match Speaker::start(b, &settings.run_dir) {
                            Ok(s) => Some(s),
                            Err(e) => {
                                let _ = ready_tx.send(Err(e.to_string()));
                                return;
                            }
                        },
                        None => None,
                    };
                    let _ = ready_tx.send(Ok(()));
                    Node::new(settings, dp, socket, rx, dropped, status, speaker).run(&stop, &new_routes);
                })
                .map_err(|e| format!("starting the cluster thread: {e}"))?
        };
        ready_rx.recv().map_err(|_| "the cluster thread ended at start".to_owned())??;
        Ok(ClusterNode { tee: EventTee { tx, dropped }, status, new_routes, stop, thread })
    }

    /// Announces `routes` from now on (a reload changed the pool): within
    /// `HEALTH_EVERY`, as the node's other announcement changes.
    pub fn set_routes(&self, routes: Routes) {
        if let Ok(mut r) = self.new_routes.lock() {
            *r = Some(routes);
        }
    }

    pub fn tee(&self) -> EventTee {
        self.tee.clone()
    }

    pub fn status(&self) -> ClusterStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// A handle the management API reads the status through.
    pub fn status_handle(&self) -> Arc<Mutex<ClusterStatus>> {
        self.status.clone()
    }

    /// Withdraws the announcements, stops BIRD and the thread.
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
    }
}

fn bind(addr: SocketAddr) -> Result<UdpSocket, String> {
    let s = UdpSocket::bind(addr).map_err(|e| format!("cluster.sync_listen {addr}: {e}"))?;
    s.set_nonblocking(true).map_err(|e| format!("cluster.sync_listen {addr}: {e}"))?;
    Ok(s)
}

struct Node {
    s: NodeSettings,
    dp: Arc<Dataplane>,
    socket: Option<UdpSocket>,
    events: Receiver<Event>,
    tee_dropped: Arc<AtomicU64>,
    status: Arc<Mutex<ClusterStatus>>,
    speaker: Option<Speaker>,
    role: Role,
    role_since: Instant,
    role_changes: u64,
    started: Instant,
    /// When an active partner was last heard, or the standby last acknowledged.
    heard: Option<Instant>,
    sender: SyncSender_,
    receiver: SyncReceiver,
    /// Records of a resync the standby asked for, not yet in the window,
    /// and the live records made since it began, behind them.
    resync: std::collections::VecDeque<Record>,
    /// A resync's state being walked by the workers: its records go in
    /// front of `resync` once all have answered.
    resync_walking: Option<natrix_dataplane::State>,
    /// The session a resync was last started for, and when: a RESYNC the
    /// standby sends again for it soon after is one it sent in case the
    /// first was lost, not a new request.
    resync_started: Option<(u32, Instant)>,
    /// A standby's RESYNC for the active session it heard: that session,
    /// how many more times to send it, and when next.
    resync_asking: Option<(u32, u32, Instant)>,
    installed: u64,
    refused: u64,
    datagrams_refused: u64,
    interfaces_up: bool,
    bgp_error: Option<String>,
    /// When BIRD, should it have exited, may be started again.
    bird_start_due: Instant,
}

impl Node {
    fn new(
        s: NodeSettings,
        dp: Arc<Dataplane>,
        socket: Option<UdpSocket>,
        events: Receiver<Event>,
        tee_dropped: Arc<AtomicU64>,
        status: Arc<Mutex<ClusterStatus>>,
        speaker: Option<Speaker>,
    ) -> Node {
        // With sync, every node starts as standby and listens for an active partner.
        let role = if socket.is_some() { Role::Standby } else { s.cluster.role };
        if socket.is_some() {
            if let Err(e) = dp.set_standby(true) {
                error!("cluster: {e}");
            }
        }
        let now = Instant::now();
        Node {
            s,
            dp,
            socket,
            events,
            tee_dropped,
            status,
            speaker,
            role,
            role_since: now,
            role_changes: 0,
            started: now,
            heard: None,
            sender: SyncSender_::new(session_id(), LIMITS),
            receiver: SyncReceiver::new(),
            resync: std::collections::VecDeque::new(),
            resync_walking: None,
            installed: 0,
            refused: 0,
            datagrams_refused: 0,
            interfaces_up: false,
            bgp_error: None,
            bird_start_due: now,
            resync_started: None,
            resync_asking: None,
        }
    }

    fn run(mut self, stop: &AtomicBool, new_routes: &Mutex<Option<Routes>>) {
        let mut health_at = Instant::now() - HEALTH_EVERY;
        while !stop.load(Ordering::Relaxed) {
            self.receive();
            self.collect_resync();
            self.feed();
            self.transmit();
            self.check_role();
            if health_at.elapsed() >= HEALTH_EVERY {
                if let Some(routes) = new_routes.lock().ok().and_then(|mut r| r.take()) {
                    self.s.routes = routes;
                }
                self.announce();
                self.publish();
                health_at = Instant::now();
            }
            std::thread::sleep(TICK);
        }
        if let Some(s) = self.speaker.take() {
            s.stop();
        }
    }

    fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    /// Takes every datagram waiting: the active partner's records (installed
    /// when standby), its heartbeats, and acknowledgements of ours.
    fn receive(&mut self) {
        let Some(sync) = self.s.cluster.sync else { return };
        let mut buf = [0u8; 2048];
        loop {
            let Some(socket) = &self.socket else { return };
            let (n, from) = match socket.recv_from(&mut buf) {
                Ok(x) => x,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => return,
                Err(e) => {
                    warn!("cluster: receiving sync datagrams: {e}");
                    return;
                }
            };
            if !from_partner(from, sync.peer) {
                self.datagrams_refused += 1;
                continue;
            }
            let msg = match Message::decode(&buf[..n]) {
                Ok(m) => m,
                Err(_) => {
                    self.datagrams_refused += 1;
                    continue;
                }
            };
            match msg {
                Message::Ack { session, ack } => {
                    if self.role == Role::Active {
                        self.sender.on_ack(session, ack);
                        self.heard = Some(Instant::now());
                    }
                }
                Message::Data { session, sequence, base, before, records } => {
                    if self.heard_active_partner() {
                        let (taken, ack) = self.receiver.on_data(session, sequence, base, before, &records);
                        self.install(taken);
                        if let Some(ack) = ack {
                            self.send(&ack.encode());
                        }
                        self.ask_resync();
                    }
                }
                Message::Alive { session, next, base, before } => {
                    if self.heard_active_partner() {
                        self.receiver.on_alive(session, next, base, before);
                        self.ask_resync();
                    }
                }
                Message::Resync { session } => {
                    let repeated = self.resync_started.is_some_and(|(s, at)| s == session && at.elapsed() < RESYNC_REPEATED_WITHIN);
                    if self.role == Role::Active && session == self.sender.session() && !repeated {
                        self.resync_started = Some((session, Instant::now()));
                        self.start_resync();
                    }
                }
            }
        }
    }

    /// The partner says it is active (DATA or ALIVE): noted, and if this
    /// node is active too, the one configured standby yields. Whether to
    /// take the message (this node is standby now).
    fn heard_active_partner(&mut self) -> bool {
        self.heard = Some(Instant::now());
        if self.role == Role::Active {
            if self.s.cluster.role != Role::Standby {
                return false;
            }
            warn!("cluster: partner {} is active too; yielding (this node is configured standby)", self.peer_text());
            self.set_role(Role::Standby);
        }
        true
    }

    fn install(&mut self, records: &[Record]) {
        if records.is_empty() {
            return;
        }
        let events: Vec<Event> = records.iter().map(|r| r.to_event()).collect();
        match self.dp.install_synced(&events) {
            Ok(t) => {
                self.installed += t.installed;
                self.refused += t.refused;
            }
            Err(e) => {
                self.refused += events.len() as u64;
                warn!("cluster: installing synced state: {e}");
            }
        }
    }

    /// A standby that hears an active session for the first time missed
    /// what it made before: it asks for all of it, and asks again a few
    /// times (the datagram may be lost), which the active partner takes as
    /// one request.
    fn ask_resync(&mut self) {
        if let Some(session) = self.receiver.take_new_session() {
            info!("cluster: asking the active partner for its state (resync)");
            self.resync_asking = Some((session, RESYNC_ASKS, Instant::now()));
        }
        let Some((session, left, due)) = self.resync_asking else { return };
        if Instant::now() < due {
            return;
        }
        self.send(&Message::Resync { session }.encode());
        self.resync_asking = (left > 1).then(|| (session, left - 1, Instant::now() + RESYNC_ASK_EVERY));
    }

    /// The standby asked for everything: every mapping, then every session,
    /// queued behind new events and fed to the window as it drains. The
    /// workers walk their tables between batches; this thread goes on with
    /// its heartbeats meanwhile (`collect_resync`), and the events made
    /// meanwhile queue behind the walk's records.
    fn start_resync(&mut self) {
        match self.dp.post_state() {
            Ok(state) => {
                self.resync.clear();
                self.resync_walking = Some(state);
            }
            Err(e) => warn!("cluster: resync: {e}"),
        }
    }

    /// Puts the resync's records, once every worker has answered, in front
    /// of the events made since.
    fn collect_resync(&mut self) {
        let Some(answer) = self.resync_walking.as_mut().and_then(natrix_dataplane::State::try_take) else { return };
        self.resync_walking = None;
        let (mappings, sessions) = match answer {
            Ok(state) => state,
            Err(e) => {
                warn!("cluster: resync: {e}");
                return;
            }
        };
        let created = |proto, int_addr, int_port, ext_addr, ext_port, rem_addr, rem_port, b4| Event {
            kind: EventKind::MappingCreated,
            time_ns: 0,
            proto,
            int_addr,
            int_port,
            ext_addr,
            ext_port,
            ext_port_end: ext_port,
            rem_addr,
            rem_port,
            b4,
        };
        let mut records: std::collections::VecDeque<Record> =
            mappings.iter().filter(|m| !m.is_static).filter_map(|m| Record::of_event(&created(m.proto, m.int_addr, m.int_port, m.ext_addr, m.ext_port, 0, 0, m.b4))).collect();
        records.extend(sessions.iter().filter_map(|v| {
            let e = Event { kind: EventKind::SessionCreated, ..created(v.proto, v.int_addr, v.int_port, v.ext_addr, v.ext_port, v.rem_addr, v.rem_port, v.b4) };
            Record::of_event(&e)
        }));
        info!("cluster: resync of {} records for the standby", records.len());
        records.append(&mut self.resync);
        self.resync = records;
    }

    /// Hands the workers' events to the sync window while active, and a
    /// resync's records while the window has room for them.
    fn feed(&mut self) {
        let now = self.now_ns();
        while let Ok(e) = self.events.try_recv() {
            if self.role == Role::Active && self.socket.is_some() {
                if let Some(r) = Record::of_event(&e) {
                    // During a resync, behind its records: a session that
                    // ends meanwhile reaches the standby created, then deleted.
                    if self.resync.is_empty() && self.resync_walking.is_none() {
                        self.sender.push(r, now);
                    } else {
                        self.resync.push_back(r);
                    }
                }
            }
        }
        if self.role != Role::Active {
            self.resync.clear();
            self.resync_walking = None;
        }
        // Nothing of a resync before its walk's records.
        while self.resync_walking.is_none() && self.sender.pending_messages() < LIMITS.max_pending / 2 {
            let Some(r) = self.resync.pop_front() else { break };
            self.sender.push(r, now);
        }
    }

    fn transmit(&mut self) {
        if self.role != Role::Active || self.socket.is_none() {
            return;
        }
        let now = self.now_ns();
        let mut out = Vec::new();
        self.sender.transmit(now, |b| out.push(b.to_vec()));
        for b in out {
            self.send(&b);
        }
    }

    fn send(&self, bytes: &[u8]) {
        if let (Some(socket), Some(sync)) = (&self.socket, self.s.cluster.sync) {
            // A full socket buffer or an unreachable partner: the window resends.
            let _ = socket.send_to(bytes, sync.peer);
        }
    }

    /// A standby whose active partner has been silent too long takes over,
    /// if it can forward.
    fn check_role(&mut self) {
        if self.socket.is_none() || self.role == Role::Active || !self.interfaces_up {
            return;
        }
        let timeout = Duration::from_millis(self.s.cluster.peer_timeout_ms);
        let silent = match self.heard {
            Some(t) => t.elapsed() >= timeout,
            None => {
                let grace = if self.s.cluster.role == Role::Standby { 3 * timeout } else { timeout };
                self.started.elapsed() >= grace
            }
        };
        if silent {
            info!("cluster: no active partner heard for {} ms: taking over", self.s.cluster.peer_timeout_ms);
            self.set_role(Role::Active);
        }
    }

    fn set_role(&mut self, role: Role) {
        if role == self.role {
            return;
        }
        info!("cluster: role {} -> {} (node {}, partition {})", self.role.name(), role.name(), self.s.cluster.node, self.s.cluster.partition);
        if let Err(e) = self.dp.set_standby(role == Role::Standby) {
            error!("cluster: {e}");
        }
        match role {
            // A new session: the partner tells this life from the last.
            Role::Active => self.sender = SyncSender_::new(session_id(), LIMITS),
            Role::Standby => self.receiver = SyncReceiver::new(),
        }
        self.role = role;
        self.role_since = Instant::now();
        self.role_changes += 1;
        self.announce();
    }

    /// Announces while both interfaces are up, prepended when standby. An
    /// active node that cannot forward hands the role over: it falls
    /// silent, so its partner takes over and streams to it.
    fn announce(&mut self) {
        self.interfaces_up = self.s.interfaces.iter().all(|i| interface_up(i));
        if !self.interfaces_up && self.role == Role::Active && self.socket.is_some() {
            warn!("cluster: an interface is down: handing the active role to the partner");
            self.set_role(Role::Standby);
        }
        self.restart_exited_speaker();
        let Some(speaker) = &mut self.speaker else { return };
        let bgp = self.s.cluster.bgp.as_ref().expect("a speaker has its config");
        let prepend = prepends(self.role, self.s.cluster.role, bgp.standby_prepend);
        let want = self.interfaces_up.then(|| Announcement { routes: self.s.routes.clone(), prepend });
        let changed = speaker.announced() != want.as_ref();
        match speaker.announce(want) {
            Ok(()) if changed => {
                self.bgp_error = None;
                match speaker.announced() {
                    Some(a) => {
                        info!("cluster: announcing {} prefixes{}", a.routes.len(), if a.prepend > 0 { format!(" (prepended {}x: standby)", a.prepend) } else { String::new() })
                    }
                    None => warn!("cluster: an interface is down: announcements withdrawn"),
                }
            }
            Ok(()) => {}
            Err(e) => {
                if self.bgp_error.as_deref() != Some(&e.to_string()) {
                    error!("cluster: {e}");
                }
                self.bgp_error = Some(e.to_string());
            }
        }
    }

    /// A BIRD that exited (killed, crashed) took the announcements with
    /// it: started again (at most every `BIRD_RESTART_EVERY`), it
    /// announces anew.
    fn restart_exited_speaker(&mut self) {
        let Some(status) = self.speaker.as_mut().and_then(Speaker::exited) else { return };
        if Instant::now() < self.bird_start_due {
            return;
        }
        self.bird_start_due = Instant::now() + BIRD_RESTART_EVERY;
        let bgp = self.s.cluster.bgp.as_ref().expect("a speaker has its config");
        match Speaker::start(bgp, &self.s.run_dir) {
            Ok(s) => {
                warn!("cluster: BIRD exited ({status}), its announcements with it: started again");
                self.speaker = Some(s);
            }
            Err(e) => {
                let why = format!("BIRD exited ({status}) and could not be started again: {e}");
                if self.bgp_error.as_deref() != Some(&why) {
                    error!("cluster: {why}");
                }
                self.bgp_error = Some(why);
            }
        }
    }

    fn peer_text(&self) -> String {
        self.s.cluster.sync.map_or_else(|| "-".to_owned(), |s| s.peer.to_string())
    }

    fn publish(&self) {
        let st = self.sender.stats();
        let rt = self.receiver.stats();
        let status = ClusterStatus {
            node: self.s.cluster.node.clone(),
            partition: self.s.cluster.partition.clone(),
            configured_role: self.s.cluster.role.name(),
            role: self.role.name(),
            role_seconds: self.role_since.elapsed().as_secs_f64(),
            role_changes: self.role_changes,
            peer: self.s.cluster.sync.map(|s| s.peer.to_string()),
            peer_heard_ms_ago: self.heard.map(|t| t.elapsed().as_millis() as u64),
            lag_records: self.sender.unacknowledged() as u64,
            records_sent: st.records_sent,
            records_acked: st.records_acked,
            records_given_up: st.records_given_up + self.tee_dropped.load(Ordering::Relaxed),
            retransmits: st.retransmits,
            records_received: rt.records_received,
            records_lost: rt.records_lost,
            records_installed: self.installed,
            records_refused: self.refused,
            datagrams_refused: self.datagrams_refused,
            announcing: self.speaker.as_ref().is_some_and(|s| s.announced().is_some()),
            interfaces_up: self.interfaces_up,
            bgp_error: self.bgp_error.clone(),
        };
        if let Ok(mut s) = self.status.lock() {
            *s = status;
        }
    }
}

/// AS path prepends by role: none for the configured active node, one for
/// a standby that took over, `standby` (at least 2) for a standby. Should
/// both nodes of a pair be active at once (the link between them down, each
/// still reaching the router), routers keep preferring the configured
/// active node instead of splitting the partition's traffic between two
/// nodes with different state.
fn prepends(role: Role, configured: Role, standby: u32) -> u32 {
    match (role, configured) {
        (Role::Active, Role::Active) => 0,
        (Role::Active, Role::Standby) => 1,
        (Role::Standby, _) => standby,
    }
}

/// A sync session id that comes after the one before a restart: the wall
/// clock in milliseconds (it wraps every 49 days; the window compares
/// sessions across the wrap).
fn session_id() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u32)
}

/// Whether the kernel says the interface is up (its operstate); an
/// interface that is gone counts as down. "unknown" (no carrier
/// reporting, as TUN devices do) counts as up.
fn interface_up(name: &str) -> bool {
    match std::fs::read_to_string(format!("/sys/class/net/{name}/operstate")) {
        Ok(s) => !matches!(s.trim(), "down" | "lowerlayerdown" | "notpresent"),
        Err(_) => false,
    }
}

/// Whether a datagram from `from` is the partner's at `peer`: on a
/// dual-stack socket (`sync_listen = "[::]:7400"`) an IPv4 partner's
/// datagrams come from its IPv4-mapped address.
fn from_partner(from: std::net::SocketAddr, peer: std::net::SocketAddr) -> bool {
    from.ip().to_canonical() == peer.ip().to_canonical()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_partner_is_recognised_on_a_dual_stack_socket() {
        let peer = "192.0.2.2:7400".parse().unwrap();
        assert!(from_partner("[::ffff:192.0.2.2]:7400".parse().unwrap(), peer));
        assert!(from_partner("192.0.2.2:40000".parse().unwrap(), peer));
        assert!(!from_partner("[::ffff:192.0.2.3]:7400".parse().unwrap(), peer));
        assert!(from_partner("[2001:db8::2]:7400".parse().unwrap(), "[2001:db8::2]:7400".parse().unwrap()));
    }

    #[test]
    fn a_configured_active_node_is_preferred_even_over_a_standby_that_took_over() {
        let active = prepends(Role::Active, Role::Active, 3);
        let promoted = prepends(Role::Active, Role::Standby, 3);
        let standby = prepends(Role::Standby, Role::Standby, 3);
        assert!(active < promoted && promoted < standby, "{active} {promoted} {standby}");
        assert_eq!(prepends(Role::Standby, Role::Active, 3), 3, "a configured active node that yielded is a standby");
    }
}
