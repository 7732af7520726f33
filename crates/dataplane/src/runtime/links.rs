//! Both interfaces, the router state around them (the gateway), the frames
//! of the current round, and the interfaces' counters: what the thread that
//! owns the interfaces works on.

use natrix_engine::Side;
use natrix_io::PacketPort;

use super::stage::{Next, Stage};
use super::{IoSnapshot, BATCH};
use crate::gateway::{Gateway, Ingress};

pub(super) struct Links {
    pub(super) ports: [Box<dyn PacketPort>; 2],
    pub(super) gateway: Gateway,
    pub(super) stage: Stage,
    pub(super) snapshot: IoSnapshot,
}

impl Links {
    pub(super) fn new(ports: [Box<dyn PacketPort>; 2], gateway: Gateway) -> Links {
        Links { ports, gateway, stage: Stage::default(), snapshot: IoSnapshot::default() }
    }

    /// Stages the gateway's announcements of natrix's addresses.
    pub(super) fn announce(&mut self) {
        let Links { gateway, stage, .. } = self;
        gateway.announce(&mut |s, f| stage.push_addressed(s, f));
    }

    /// Receives a batch on `side`; `f` gets each IP frame for the NAT and
    /// may stage frames to send.
    pub(super) fn receive(&mut self, side: Side, now: u64, f: &mut dyn FnMut(&mut [u8], &mut Stage)) -> usize {
        let Links { ports, gateway, stage, snapshot } = self;
        let s = side as usize;
        ports[s]
            .recv_batch(BATCH, &mut |frame| {
                snapshot.rx_frames[s] += 1;
                snapshot.rx_bytes[s] += frame.len() as u64;
                if gateway.ingress(side, frame, now, &mut |out, f| stage.push_addressed(out, f)) == Ingress::Engine {
                    f(frame, stage);
                }
            })
            .unwrap_or(0)
    }

    /// Sends a frame through the next-hop logic.
    pub(super) fn send(&mut self, side: Side, frame: &mut [u8], now: u64) {
        let Links { ports, gateway, snapshot, .. } = self;
        gateway.egress(side, frame, now, &mut |out, f| transmit(ports, snapshot, out, f));
    }

    /// Sends every staged frame and kicks both interfaces.
    pub(super) fn flush(&mut self, now: u64) {
        let mut stage = std::mem::take(&mut self.stage);
        for &(side, at, len, next) in &stage.frames {
            debug_assert_ne!(next, Next::Translate, "flush: a received frame was never translated");
            let frame = &mut stage.bytes[at..at + len];
            match next {
                Next::Route => self.send(side, frame, now),
                Next::Send => transmit(&mut self.ports, &mut self.snapshot, side, frame),
                Next::Translate | Next::Nothing => {}
            }
        }
        stage.frames.clear();
        stage.bytes.clear();
        self.stage = stage;
        for p in &mut self.ports {
            let _ = p.flush();
        }
        self.gateway.expire(now);
    }

    pub(super) fn snapshot(&mut self) -> IoSnapshot {
        let mut s = self.snapshot.clone();
        for (i, p) in self.ports.iter_mut().enumerate() {
            s.rx_kernel_dropped[i] = p.kernel_dropped();
            s.rx_refused[i] = p.dropped_on_receive();
            s.tx_dropped[i] += p.dropped_on_transmit();
        }
        s.gateway = self.gateway.counters.clone();
        s
    }

    pub(super) fn fds(&self) -> [i32; 2] {
        [self.ports[0].fd(), self.ports[1].fd()]
    }
}

fn transmit(ports: &mut [Box<dyn PacketPort>; 2], snapshot: &mut IoSnapshot, side: Side, frame: &[u8]) {
    let s = side as usize;
    if ports[s].send(frame) {
        snapshot.tx_frames[s] += 1;
        snapshot.tx_bytes[s] += frame.len() as u64;
    } else {
        snapshot.tx_dropped[s] += 1;
    }
}
