//! What operators ask of the dataplane threads, and the handle that asks:
//! each thread checks its channel between batches and answers on the
//! sender that came with the request.

use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Duration;

use natrix_engine::admin::{Cleared, MappingView, SessionView, Walk};
use natrix_engine::{EngineConfig, Event};

use super::{IoSnapshot, WorkerSnapshot};
use crate::ring::Doorbell;

/// What a reloaded configuration changes on the links: the addresses
/// natrix answers for, and the pool the hairpin check reads.
#[derive(Clone)]
pub(super) struct LinkReload {
    /// Outside: the pool's addresses natrix answers ARP for.
    pub answers: Vec<u32>,
    /// Inside: the DS-Lite AFTR addresses natrix answers Neighbor
    /// Solicitations for.
    pub answers6: Vec<std::net::Ipv6Addr>,
    /// The pool, sorted.
    pub pool: Vec<u32>,
}

pub(super) const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) enum Command {
    Worker(Sender<WorkerSnapshot>),
    Io(Sender<IoSnapshot>),
    /// Sessions as the walk asks (a subscriber's, a B4's, at most so many).
    Sessions(Walk<SessionView>, Sender<Vec<SessionView>>),
    Mappings(Walk<MappingView>, Sender<Vec<MappingView>>),
    Clear(u32, Sender<Cleared>),
    Reload(Box<EngineConfig>, Sender<Result<(), natrix_engine::EngineError>>),
    /// What a reload changes on the links.
    ReloadLinks(LinkReload, Sender<()>),
    /// Session sync: the active node's events for this worker's subscribers.
    InstallSynced(Vec<Event>, Sender<SyncTally>),
    /// Cluster role: standby (synced sessions wait for deletions) or active.
    SetStandby(bool, Sender<()>),
}

/// What installing synced events came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncTally {
    pub installed: u64,
    /// Events the engine refused (`natrix_engine::nat44::synced::SyncRefusal`).
    pub refused: u64,
}

/// One thread's command channel and the doorbell that wakes it.
pub(super) struct Control {
    pub(super) commands: Sender<Command>,
    pub(super) doorbell: Arc<Doorbell>,
}

impl Control {
    pub(super) fn new(commands: Sender<Command>, doorbell: Arc<Doorbell>) -> Control {
        Control { commands, doorbell }
    }

    /// Sends a request and waits for the answer.
    pub(super) fn ask<T>(&self, make: impl FnOnce(Sender<T>) -> Command) -> Result<T, ControlError> {
        self.post(make)?.recv_timeout(COMMAND_TIMEOUT).map_err(|_| ControlError::NoAnswer)
    }

    /// Sends a request; its answer comes on the receiver returned.
    pub(super) fn post<T>(&self, make: impl FnOnce(Sender<T>) -> Command) -> Result<mpsc::Receiver<T>, ControlError> {
        let (tx, rx) = mpsc::channel();
        self.commands.send(make(tx)).map_err(|_| ControlError::Stopped)?;
        self.doorbell.ring_always();
        Ok(rx)
    }
}

/// Every mapping and every session of the dataplane's workers.
pub type StateRows = (Vec<MappingView>, Vec<SessionView>);

/// Every worker's mappings and sessions, being made (`Dataplane::post_state`).
pub struct State {
    pub(super) mappings: Vec<mpsc::Receiver<Vec<MappingView>>>,
    pub(super) sessions: Vec<mpsc::Receiver<Vec<SessionView>>>,
    pub(super) got: StateRows,
    pub(super) deadline: std::time::Instant,
}

impl State {
    /// Every mapping and every session once all the workers have answered;
    /// None while some are still walking; an error once the deadline has
    /// passed or a worker stopped.
    pub fn try_take(&mut self) -> Option<Result<StateRows, ControlError>> {
        if let Err(e) = take_answers(&mut self.mappings, &mut self.got.0).and_then(|()| take_answers(&mut self.sessions, &mut self.got.1)) {
            return Some(Err(e));
        }
        if self.mappings.is_empty() && self.sessions.is_empty() {
            return Some(Ok(std::mem::take(&mut self.got)));
        }
        (std::time::Instant::now() > self.deadline).then_some(Err(ControlError::NoAnswer))
    }
}

/// Moves the answers that have come into `rows`, in the workers' order.
fn take_answers<T>(pending: &mut Vec<mpsc::Receiver<Vec<T>>>, rows: &mut Vec<T>) -> Result<(), ControlError> {
    while let Some(first) = pending.first() {
        match first.try_recv() {
            Ok(answer) => {
                rows.extend(answer);
                pending.remove(0);
            }
            Err(mpsc::TryRecvError::Empty) => return Ok(()),
            Err(mpsc::TryRecvError::Disconnected) => return Err(ControlError::NoAnswer),
        }
    }
    Ok(())
}

/// Which rows a listing asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Only {
    /// One subscriber's (its inside address, or a DS-Lite host's stand-in).
    pub subscriber: Option<u32>,
    /// Those of the DS-Lite hosts behind one B4.
    pub b4: Option<std::net::Ipv6Addr>,
}

/// Why an operator's request to a running dataplane failed.
#[derive(Debug)]
pub enum ControlError {
    /// The thread that owns the state has stopped.
    Stopped,
    /// It did not answer in time.
    NoAnswer,
    /// It refused a reloaded configuration.
    Refused(natrix_engine::EngineError),
    /// A reload that `applied` of `of` workers had taken when the next did
    /// not answer (it may still take it): they may now run different
    /// configurations.
    PartlyApplied { applied: usize, of: usize },
}

impl std::fmt::Display for ControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlError::Stopped => f.write_str("a dataplane thread has stopped"),
            ControlError::NoAnswer => f.write_str("a dataplane thread did not answer"),
            ControlError::Refused(e) => write!(f, "{e}"),
            ControlError::PartlyApplied { applied, of } => write!(
                f,
                "worker {applied} did not answer within {} s, when {applied} of {of} workers had taken the new configuration (it may still take it): restart natrix to run one configuration on every worker",
                COMMAND_TIMEOUT.as_secs()
            ),
        }
    }
}

impl std::error::Error for ControlError {}
