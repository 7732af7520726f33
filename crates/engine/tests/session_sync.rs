//! Session sync's install API (`Engine::install_synced`): a standby given
//! its active node's events translates the active node's flows to the same
//! external endpoints, keeps ports held down, and ends state when told.
//! Frames are built and judged with etherparse.

#![allow(clippy::too_many_arguments)]

mod common;

use common::*;
use natrix_engine::config::PortSelection;
use natrix_engine::events::{Event, EventKind};
use natrix_engine::nat44::synced::SyncRefusal;
use natrix_engine::{DropReason, Engine, EngineConfig, Proto, Side, Verdict};

const REMOTE: [u8; 4] = [198, 51, 100, 7];

fn cfg() -> EngineConfig {
    EngineConfig { port_selection: PortSelection::Random, log_sessions: true, ..config() }
}

fn send_out(e: &mut Engine, sub: [u8; 4], sport: u16, now: u64) -> (Verdict, Option<([u8; 4], u16)>) {
    let mut f = udp_frame(Side::Inside, sub, sport, REMOTE, 53, 64, b"q", false);
    let v = run(e, &mut f, Side::Inside, now);
    let ext = (v == Verdict::Forward(Side::Outside)).then(|| {
        let d = must_decode(&f);
        (d.ip.source, d.udp().source_port)
    });
    (v, ext)
}

fn events(e: &mut Engine) -> Vec<Event> {
    let mut v = Vec::new();
    e.drain_events(|ev| v.push(ev));
    v
}

fn install_all(standby: &mut Engine, evs: &[Event]) {
    for ev in evs {
        standby.install_synced(ev).unwrap_or_else(|r| panic!("{ev:?}: {r}"));
    }
}

fn standby(c: EngineConfig) -> Engine {
    let mut s = engine(c);
    s.set_standby(true);
    s
}

#[test]
fn a_standby_translates_the_active_nodes_flows_to_the_same_endpoints() {
    let mut active = engine(cfg());
    let mut stby = standby(cfg());
    let subs = [[100, 64, 0, 5], [100, 64, 0, 6], [100, 64, 1, 9]];
    let mut ext = Vec::new();
    for (i, sub) in subs.iter().enumerate() {
        ext.push(send_out(&mut active, *sub, 4000 + i as u16, SEC).1.unwrap());
    }
    install_all(&mut stby, &events(&mut active));
    stby.set_standby(false);
    for (i, sub) in subs.iter().enumerate() {
        let (v, got) = send_out(&mut stby, *sub, 4000 + i as u16, 2 * SEC);
        assert_eq!(v, Verdict::Forward(Side::Outside));
        assert_eq!(got.unwrap(), ext[i], "subscriber {sub:?} keeps its external endpoint");
        // The remote's reply reaches the subscriber through the standby.
        let (addr, port) = ext[i];
        let mut reply = udp_frame(Side::Outside, REMOTE, 53, addr, port, 64, b"a", false);
        assert_eq!(run(&mut stby, &mut reply, Side::Outside, 2 * SEC), Verdict::Forward(Side::Inside));
        let d = must_decode(&reply);
        assert_eq!((d.ip.destination, d.udp().destination_port), (*sub, 4000 + i as u16));
    }
}

#[test]
fn an_established_tcp_connection_passes_the_standby_after_failover() {
    let mut active = engine(cfg());
    let mut stby = standby(cfg());
    let sub = [100, 64, 0, 5];
    let mut syn = tcp_frame(Side::Inside, sub, 5555, REMOTE, 80, 64, TcpKind::Syn, 1, 0, b"");
    assert_eq!(run(&mut active, &mut syn, Side::Inside, SEC), Verdict::Forward(Side::Outside));
    let d = must_decode(&syn);
    let (ext_addr, ext_port) = (d.ip.source, d.tcp().source_port);
    let mut synack = tcp_frame(Side::Outside, REMOTE, 80, ext_addr, ext_port, 64, TcpKind::SynAck, 9, 2, b"");
    assert_eq!(run(&mut active, &mut synack, Side::Outside, SEC), Verdict::Forward(Side::Inside));
    install_all(&mut stby, &events(&mut active));
    stby.set_standby(false);
    // Mid-stream segments, no handshake: both ways, same endpoints.
    let mut data = tcp_frame(Side::Inside, sub, 5555, REMOTE, 80, 64, TcpKind::Ack, 2, 10, b"GET /");
    assert_eq!(run(&mut stby, &mut data, Side::Inside, 2 * SEC), Verdict::Forward(Side::Outside));
    let d = must_decode(&data);
    assert_eq!((d.ip.source, d.tcp().source_port), (ext_addr, ext_port));
    let mut back = tcp_frame(Side::Outside, REMOTE, 80, ext_addr, ext_port, 64, TcpKind::Ack, 10, 7, b"200");
    assert_eq!(run(&mut stby, &mut back, Side::Outside, 2 * SEC), Verdict::Forward(Side::Inside));
    // Installed as established: still there past the transitory timeout (240 s).
    stby.advance(300 * SEC);
    assert_eq!(stby.session_views(None).len(), 1);
}

#[test]
fn a_port_the_active_node_holds_down_is_held_on_the_standby_too() {
    // One address, two ports: a held port leaves one for everyone else.
    let one = EngineConfig { pool: vec![u32_of([203, 0, 113, 1])], ports: (1024, 1025), port_parity: false, ..cfg() };
    let mut active = engine(one.clone());
    let mut stby = standby(one);
    let (_, first) = send_out(&mut active, [100, 64, 0, 5], 4000, SEC);
    let (_, held) = first.unwrap();
    active.advance(400 * SEC); // past the UDP timeout: deleted, port held down (120 s)
    let evs = events(&mut active);
    assert!(evs.iter().any(|e| e.kind == EventKind::MappingDeleted));
    // The standby's clock runs as the active node's does.
    stby.advance(400 * SEC);
    install_all(&mut stby, &evs);
    stby.advance(401 * SEC);
    stby.set_standby(false);
    let (_, other) = send_out(&mut stby, [100, 64, 0, 6], 4001, 402 * SEC);
    assert_ne!(other.unwrap().1, held, "the standby does not hand out a port held down");
    let (v, _) = send_out(&mut stby, [100, 64, 0, 7], 4002, 402 * SEC);
    assert_eq!(v, Verdict::Drop(DropReason::PoolExhausted));
}

#[test]
fn synced_sessions_wait_for_deletions_while_standby_and_expire_after_promotion() {
    let mut active = engine(cfg());
    let mut stby = standby(cfg());
    send_out(&mut active, [100, 64, 0, 5], 4000, SEC);
    install_all(&mut stby, &events(&mut active));
    stby.advance(1000 * SEC);
    assert_eq!(stby.mapping_views(None).len(), 1, "no expiry while standby");
    stby.set_standby(false);
    stby.advance(1000 * SEC + 299 * SEC);
    assert_eq!(stby.mapping_views(None).len(), 1, "a full idle timeout from promotion");
    stby.advance(1000 * SEC + 302 * SEC);
    assert_eq!(stby.mapping_views(None).len(), 0);
}

#[test]
fn deletions_end_state_on_the_standby_and_installing_twice_changes_nothing() {
    let mut active = engine(cfg());
    let mut stby = standby(cfg());
    send_out(&mut active, [100, 64, 0, 5], 4000, SEC);
    let created = events(&mut active);
    install_all(&mut stby, &created);
    install_all(&mut stby, &created);
    assert_eq!((stby.mapping_views(None).len(), stby.session_views(None).len()), (1, 1));
    let mut no_events = Vec::new();
    stby.drain_events(|e| no_events.push(e));
    assert!(no_events.is_empty(), "installing logs nothing: the active node logged it");
    active.advance(400 * SEC);
    install_all(&mut stby, &events(&mut active));
    assert_eq!((stby.mapping_views(None).len(), stby.session_views(None).len()), (0, 0));
}

#[test]
fn block_mode_installs_the_block_and_later_ports_come_from_it() {
    let blocks = EngineConfig { port_block_size: 64, ..cfg() };
    let mut active = engine(blocks.clone());
    let mut stby = standby(blocks);
    let sub = [100, 64, 0, 5];
    let (_, first) = send_out(&mut active, sub, 4000, SEC);
    let evs = events(&mut active);
    let block = evs.iter().find(|e| e.kind == EventKind::BlockAllocated).expect("a block");
    install_all(&mut stby, &evs);
    stby.set_standby(false);
    let (_, again) = send_out(&mut stby, sub, 4000, 2 * SEC);
    assert_eq!(again, first);
    let (_, next) = send_out(&mut stby, sub, 4001, 2 * SEC);
    let (addr, port) = next.unwrap();
    assert_eq!(u32_of(addr), block.ext_addr);
    assert!((block.ext_port..=block.ext_port_end).contains(&port), "{port} outside the synced block");
}

#[test]
fn a_mapping_whose_block_record_was_lost_takes_its_block_with_it() {
    let blocks = EngineConfig { port_block_size: 64, ..cfg() };
    let mut active = engine(blocks.clone());
    let mut stby = standby(blocks);
    let sub = [100, 64, 0, 5];
    send_out(&mut active, sub, 4000, SEC);
    let evs: Vec<Event> = events(&mut active).into_iter().filter(|e| e.kind != EventKind::BlockAllocated).collect();
    install_all(&mut stby, &evs);
    stby.set_standby(false);
    let (_, first) = send_out(&mut stby, sub, 4000, 2 * SEC);
    let (_, next) = send_out(&mut stby, sub, 4001, 2 * SEC);
    let (port, other) = (first.unwrap().1, next.unwrap().1);
    assert_eq!((port - 1024) / 64, (other - 1024) / 64, "the subscriber's next port comes from the block its mapping implied");
}

#[test]
fn state_natrix_does_not_sync_is_refused_by_name() {
    let mut stby = standby(cfg());
    let e = |kind, proto, ext_addr| Event {
        kind,
        time_ns: 0,
        proto,
        int_addr: u32_of([100, 64, 0, 5]),
        int_port: 1,
        ext_addr,
        ext_port: 2000,
        ext_port_end: 2000,
        rem_addr: 0,
        rem_port: 0,
        b4: None,
    };
    let pool = u32_of([203, 0, 113, 1]);
    assert_eq!(stby.install_synced(&e(EventKind::MappingCreated, Proto::Sctp, pool)), Err(SyncRefusal::Unsupported));
    assert_eq!(stby.install_synced(&e(EventKind::MappingCreated, Proto::Udp, u32_of([192, 0, 2, 1]))), Err(SyncRefusal::NotInPool));
    assert_eq!(stby.install_synced(&e(EventKind::SessionCreated, Proto::Udp, pool)), Err(SyncRefusal::NoMapping));
    assert_eq!(stby.install_synced(&e(EventKind::QuotaExceeded, Proto::Udp, pool)), Err(SyncRefusal::NotState));
    assert_eq!(stby.install_synced(&e(EventKind::MappingCreated, Proto::Udp, pool)), Ok(()));
    let moved = Event { ext_port: 2001, ..e(EventKind::MappingCreated, Proto::Udp, pool) };
    assert_eq!(stby.install_synced(&moved), Err(SyncRefusal::Conflict));
}
