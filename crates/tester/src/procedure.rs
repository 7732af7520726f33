//! The measurement procedures, each over a `Testbed` (the device under
//! test with the tester's two ports around it), so that they run the same
//! against natrix, the kernel, or a fake device in the unit tests.
//!
//! RFC 9693 (section 4) runs every test in two phases. The preliminary
//! phase creates the connections: each of the N 4-tuples once, in
//! pseudorandom order, at a rate the device can take, and the responder
//! learns the external endpoint of each. Its validation sends one frame
//! back to every learned endpoint; only if all N arrive is the table known
//! to hold the N connections. The real test phase then sends frames of
//! connections drawn at random, all existing ones. The maximum connection
//! establishment rate is the highest rate at which the preliminary phase
//! and its validation pass from an empty table (section 4.4); the
//! tear-down rate is N over the time deleting N connections takes, less
//! the time deleting none takes (section 4.5); the table capacity comes
//! from `search::table_capacity` (section 4.6). Throughput, frame loss
//! rate (RFC 2544 sections 26.1 and 26.3), latency and PDV (RFC 8219
//! sections 7.2 and 7.3) run in the real test phase.

use std::time::Duration;

use serde_json::{json, Value};

use crate::engine::{Kind, Pick, Stream, TrialOutcome, TrialPlan};
use crate::pacing::Rate;
use crate::report::{object, Criterion, Line};
use crate::search::{self, CapacitySearch, RateSearch};
use crate::seed002::Rung;
use crate::stats::{self, Summary};

/// What can stop a procedure.
#[derive(Debug)]
pub enum TestError {
    Io(natrix_io::IoError),
    /// The device under test could not be reset, emptied or asked.
    Dut(String),
    /// A preliminary phase that had to pass did not: nothing after it
    /// would mean anything.
    Setup(String),
    Interrupted,
}

impl std::fmt::Display for TestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TestError::Io(e) => write!(f, "tester I/O: {e}"),
            TestError::Dut(m) => write!(f, "device under test: {m}"),
            TestError::Setup(m) => f.write_str(m),
            TestError::Interrupted => f.write_str("interrupted"),
        }
    }
}

impl std::error::Error for TestError {}

impl From<natrix_io::IoError> for TestError {
    fn from(e: natrix_io::IoError) -> TestError {
        TestError::Io(e)
    }
}

/// CPU time consumed so far, for the CPU cost of forwarding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// Busy time of every CPU of the machine together.
    pub machine_busy_ns: u64,
    /// The device's own work, where it can be told apart: natrix's
    /// process, or the busy time of the CPUs the kernel forwards on.
    pub dut_ns: Option<u64>,
    /// The part of `dut_ns` spent on frames rather than waiting for them
    /// (natrix polls on for a while after each frame at high rates).
    pub dut_work_ns: Option<u64>,
    /// The part of `dut_ns` (and of `dut_work_ns`) that is whole CPUs'
    /// busy time, other tenants' included: all of the kernel's, and the
    /// receive work of natrix's links where they have no NAPI threads.
    /// Its rate in a quiet spell is taken off as background; a device's
    /// own threads are charged all their time, their idle polling too.
    pub dut_shared_ns: Option<u64>,
}

/// The device under test with the tester around it.
pub trait Testbed {
    /// "natrix" or "kernel".
    fn dut(&self) -> &str;
    /// Empties the device's connection table; the tester forgets what it learned.
    fn reset(&mut self) -> Result<(), TestError>;
    /// Deletes every connection at once (RFC 9693 section 4.5); how long it took.
    fn delete_all(&mut self) -> Result<Duration, TestError>;
    fn trial(&mut self, plan: &TrialPlan) -> Result<TrialOutcome, TestError>;
    /// CPU time so far; None where it cannot be read.
    fn cpu(&mut self) -> Option<CpuTimes>;
    /// A progress message for the operator.
    fn note(&mut self, msg: &str);
}

/// How a run is sized.
#[derive(Debug, Clone)]
pub struct Settings {
    /// N: the connections of the real test phase.
    pub flows: u32,
    /// Seconds of each throughput and frame loss trial, in nanoseconds.
    pub trial_ns: u64,
    /// Of the latency and PDV trial.
    pub latency_ns: u64,
    /// Of each of seed 002's rungs.
    pub goodput_ns: u64,
    /// The highest rate any search tries: the generator's ceiling.
    pub max_rate: f64,
    /// Searches end when the bounds are this share of their range apart.
    pub resolution: f64,
    /// Rate of preliminary phases that are not themselves measured.
    pub fill_rate: f64,
    pub criterion: Criterion,
    pub capacity: CapacitySearch,
    /// Frames sent both ways in the real test phase (RFC 2544 bidirectional).
    pub bidirectional: bool,
    /// How long a trial waits for late frames.
    pub drain_ns: u64,
    pub teardown_repeats: u32,
    /// The fixed rate at which the CPU cost per frame is measured, and for how long.
    pub cpu_rate: f64,
    pub cpu_ns: u64,
    pub seed: u64,
}

/// Frame size of the connection tests (RFC 9693 uses the smallest).
pub const CONNECTION_FRAME: usize = 64;

/// Results of a run, with what the plots need.
#[derive(Debug, Default, Clone)]
pub struct Results {
    pub lines: Vec<Line>,
    /// Table capacity search: (connections, maximum establishment rate).
    pub capacity_points: Vec<(u64, f64)>,
    /// Per frame size, the sorted latencies of the latency trial, ns.
    pub latencies: Vec<(usize, Vec<u32>)>,
}

/// The result of a preliminary phase and its validation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Preliminary {
    pub conns: u32,
    pub requested_pps: f64,
    pub sent_pps: f64,
    /// Connections whose frame reached the responder.
    pub created: u64,
    /// Validation frames that reached the initiator.
    pub validated: u64,
    /// Frames the tester's own ports lost in either phase.
    pub tester_dropped: u64,
}

impl Preliminary {
    /// Every connection created and validated, or as nearly as `criterion`
    /// allows (RFC 9693 asks for all: `Criterion::Zero`).
    pub fn passed(&self, criterion: Criterion) -> bool {
        let n = f64::from(self.conns.max(1));
        let lost = |got: u64| 1.0 - got.min(u64::from(self.conns)) as f64 / n;
        criterion.allows(lost(self.created)) && criterion.allows(lost(self.validated))
    }
}

/// RFC 9693's preliminary phase for `conns` connections at `rate`, and its
/// validation at the same rate.
pub fn preliminary(tb: &mut dyn Testbed, s: &Settings, conns: u32, rate: f64) -> Result<Preliminary, TestError> {
    let mut plan = TrialPlan::new(Kind::Udp { frame_size: CONNECTION_FRAME });
    plan.forward = Some(Stream { pick: Pick::Enumerate { conns, seed: s.seed }, rate: Rate::pps(rate), frames: u64::from(conns), burst: 1 });
    plan.learn = true;
    plan.drain_ns = s.drain_ns;
    let phase1 = tb.trial(&plan)?;
    let created = Preliminary {
        conns,
        requested_pps: rate,
        sent_pps: phase1.forward.sent_pps(),
        created: phase1.forward.received,
        validated: u64::from(conns),
        tester_dropped: phase1.tester_dropped,
    };
    if !created.passed(s.criterion) {
        // More connections were lost already than the criterion allows:
        // validating them would only take time.
        let p = Preliminary { validated: 0, ..created };
        tb.note(&format!("preliminary phase: {conns} connections at {:.1} kpps: {} created", rate / 1e3, p.created));
        return Ok(p);
    }
    let mut check = TrialPlan::new(Kind::Udp { frame_size: CONNECTION_FRAME });
    check.reverse = Some(Stream { pick: Pick::Enumerate { conns, seed: s.seed ^ 0x5a5a }, rate: Rate::pps(rate), frames: u64::from(conns), burst: 1 });
    check.drain_ns = s.drain_ns;
    let validation = tb.trial(&check)?;
    let p = Preliminary { validated: validation.reverse.received, tester_dropped: created.tester_dropped + validation.tester_dropped, ..created };
    tb.note(&format!("preliminary phase: {conns} connections at {:.1} kpps: {} created, {} validated", rate / 1e3, p.created, p.validated));
    Ok(p)
}

/// Attempts at filling the table before a test gives up, each at half the
/// rate of the one before.
const FILL_ATTEMPTS: u32 = 3;

/// Fills an empty table with the run's N connections at the fill rate
/// (halved after a failure, for a device or a machine that had a hiccup);
/// an error when the device does not take them.
pub fn establish(tb: &mut dyn Testbed, s: &Settings) -> Result<(), TestError> {
    let mut rate = s.fill_rate;
    let mut last = None;
    for _ in 0..FILL_ATTEMPTS {
        tb.reset()?;
        let p = preliminary(tb, s, s.flows, rate)?;
        if p.passed(s.criterion) {
            return Ok(());
        }
        last = Some(p);
        rate /= 2.0;
    }
    let p = last.expect("at least one attempt");
    Err(TestError::Setup(format!(
        "the preliminary phase failed {FILL_ATTEMPTS} times, the last at {:.1} kpps: {} of {} connections created, {} validated; try a lower --fill-rate or fewer --flows",
        p.requested_pps / 1e3,
        p.created,
        s.flows,
        p.validated
    )))
}

/// The rate a trial really offered: what it sent, or what was asked when
/// too few frames left to tell.
fn offered(requested: f64, sent_pps: f64) -> f64 {
    if sent_pps > 0.0 {
        sent_pps
    } else {
        requested
    }
}

/// The loss criterion a trial that lost `loss` meets (the contract's
/// `criterion`): `wanted` when it allows that loss, else the loss itself,
/// so that no line that lost frames claims zero loss.
fn met(wanted: Criterion, loss: f64) -> Criterion {
    if wanted.allows(loss) {
        wanted
    } else {
        Criterion::from_fraction(loss)
    }
}

/// The generator fell short of the rate asked of it by more than 1%.
fn short_of(requested: f64, sent_pps: f64) -> bool {
    sent_pps > 0.0 && sent_pps < requested * 0.99
}

/// A trial's figures are the tester's rather than the device's: it sent
/// short of the rate asked, or its own ports lost frames.
fn tester_limited(requested: f64, o: &TrialOutcome) -> bool {
    short_of(requested, o.forward.sent_pps()) || o.tester_dropped > 0
}

/// RFC 9693 section 4.4: the maximum connection establishment rate.
pub fn connection_rate(tb: &mut dyn Testbed, s: &Settings) -> Result<Line, TestError> {
    let mut best: Option<Preliminary> = None;
    let mut tester_failed = false;
    let search = RateSearch { lo: 0.0, hi: s.max_rate, resolution: s.max_rate * s.resolution, give_up_below: 0.0 };
    let found = search::highest_passing(search, |rate| {
        tb.reset()?;
        let p = preliminary(tb, s, s.flows, rate)?;
        let passed = p.passed(s.criterion);
        if passed && best.is_none_or(|b| p.requested_pps > b.requested_pps) {
            best = Some(p);
        }
        tester_failed |= !passed && p.tester_dropped > 0;
        Ok::<_, TestError>(passed)
    })?;
    let (rate, sent) = best.map_or((0.0, 0.0), |b| (b.requested_pps, b.sent_pps));
    let result = object([("rate_pps", json!(offered(rate, sent))), ("requested_pps", json!(rate)), ("probes", json!(found.probes))]);
    let limited = found.failed_at.is_none() || short_of(rate, sent) || tester_failed;
    Ok(line(tb, "connection_rate", "RFC 9693", CONNECTION_FRAME, s.flows.into(), s.criterion, result, limited))
}

/// RFC 9693 section 4.5: N connections over the time deleting them takes,
/// less the time deleting an empty table takes. Each repeat fills the
/// table and deletes it, then times the empty table three times (the
/// fastest counts: the fixed cost, undisturbed); the rate comes from the
/// medians. None when the difference is within the clock's noise.
pub fn teardown_rate(tb: &mut dyn Testbed, s: &Settings) -> Result<Line, TestError> {
    let (mut full_ms, mut empty_ms) = (Vec::new(), Vec::new());
    for _ in 0..s.teardown_repeats.max(1) {
        establish(tb, s)?;
        let full = tb.delete_all()?;
        let mut empty = Duration::MAX;
        for _ in 0..3 {
            empty = empty.min(tb.delete_all()?);
        }
        tb.note(&format!("tear-down: {} connections deleted in {:.3} ms, an empty table in {:.3} ms", s.flows, ms(full), ms(empty)));
        full_ms.push(ms(full));
        empty_ms.push(ms(empty));
    }
    let net_ms = median_f64(&full_ms) - median_f64(&empty_ms);
    let rate = (net_ms > 0.0).then(|| f64::from(s.flows) / (net_ms / 1e3));
    let result = object([("rate_cps", json!(rate)), ("delete_ms", json!(full_ms)), ("delete_empty_ms", json!(empty_ms))]);
    Ok(line(tb, "teardown_rate", "RFC 9693", CONNECTION_FRAME, s.flows.into(), Criterion::Zero, result, false))
}

fn median_f64(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// RFC 9693 section 4.6: the connection tracking table capacity.
pub fn table_capacity(tb: &mut dyn Testbed, s: &Settings, top_rate: f64) -> Result<(Line, Vec<(u64, f64)>), TestError> {
    let found = search::table_capacity(s.capacity, top_rate, |flows, upper, stop| {
        let conns = u32::try_from(flows).unwrap_or(u32::MAX);
        let search = RateSearch { lo: 0.0, hi: upper, resolution: upper * s.resolution.max(1.0 / 16.0), give_up_below: stop };
        let f = search::highest_passing(search, |rate| {
            tb.reset()?;
            Ok::<_, TestError>(preliminary(tb, s, conns, rate)?.passed(s.criterion))
        })?;
        tb.note(&format!("table capacity: {flows} connections: {}", f.rate.map_or("no rate passed".into(), |r| format!("{:.1} kpps", r / 1e3))));
        Ok::<_, TestError>(f.rate.unwrap_or(0.0))
    })?;
    let result = object([("flows", json!(found.flows)), ("rate_pps", json!(found.rate_pps)), ("at_least", json!(found.at_least)), ("searched_up_to", json!(s.capacity.max))]);
    let l = line(tb, "table_capacity", "RFC 9693", CONNECTION_FRAME, found.flows, s.criterion, result, false);
    Ok((l, found.points))
}

/// A real-test-phase trial: frames of the N connections drawn at random.
fn phase2_plan(s: &Settings, frame_size: usize, rate: f64, ns: u64, seed: u64) -> TrialPlan {
    let stream = |seed| Stream { pick: Pick::Random { conns: s.flows, seed }, rate: Rate::pps(rate), frames: Rate::pps(rate).frames_in(ns).max(1), burst: 1 };
    let mut plan = TrialPlan::new(Kind::Udp { frame_size });
    plan.forward = Some(stream(seed));
    if s.bidirectional {
        plan.reverse = Some(stream(seed ^ 0xa5a5));
    }
    plan.drain_ns = s.drain_ns;
    plan
}

/// The larger loss of the directions sent.
fn loss_of(o: &TrialOutcome, s: &Settings) -> f64 {
    if s.bidirectional {
        o.forward.loss().max(reverse_loss(o))
    } else {
        o.forward.loss()
    }
}

/// The reverse direction's loss, its frames to connections whose endpoint
/// was never learned counted lost: the device lost those connections (a
/// preliminary phase a loss criterion let pass with some missing).
fn reverse_loss(o: &TrialOutcome) -> f64 {
    let wanted = o.reverse.sent + o.unlearned;
    if wanted == 0 {
        return 0.0;
    }
    1.0 - o.reverse.received.min(wanted) as f64 / wanted as f64
}

fn phase2_trial(tb: &mut dyn Testbed, s: &Settings, frame_size: usize, rate: f64, ns: u64, seed: u64) -> Result<TrialOutcome, TestError> {
    let o = tb.trial(&phase2_plan(s, frame_size, rate, ns, seed))?;
    tb.note(&format!(
        "{frame_size} B at {:.1} kpps: sent {:.1} kpps, loss {:.4}%{}",
        rate / 1e3,
        o.forward.sent_pps() / 1e3,
        loss_of(&o, s) * 100.0,
        if o.problems.total() > 0 { format!(", problems {:?}", o.problems) } else { String::new() }
    ));
    if o.tester_dropped > 0 {
        tb.note(&format!("the tester's own ports lost {} frames in that trial: its limit, not the device's", o.tester_dropped));
    }
    Ok(o)
}

/// RFC 2544 section 26.1 in RFC 9693's real test phase: the highest rate
/// whose loss meets the criterion.
pub fn throughput(tb: &mut dyn Testbed, s: &Settings, frame_size: usize) -> Result<(Line, Option<f64>), TestError> {
    establish(tb, s)?;
    let mut best: Option<(f64, TrialOutcome)> = None;
    let mut tester_failed = false;
    let mut seed = s.seed;
    let search = RateSearch { lo: 0.0, hi: s.max_rate, resolution: s.max_rate * s.resolution, give_up_below: 0.0 };
    let found = search::highest_passing(search, |rate| {
        seed += 1;
        let o = phase2_trial(tb, s, frame_size, rate, s.trial_ns, seed)?;
        let passed = s.criterion.allows(loss_of(&o, s));
        // A probe the tester's own losses failed bounds the search by the
        // tester: the rate found may be its limit.
        tester_failed |= !passed && o.tester_dropped > 0;
        if passed && best.as_ref().is_none_or(|(r, _)| rate > *r) {
            best = Some((rate, o));
        }
        Ok::<_, TestError>(passed)
    })?;
    let (rate, sent, received) = best.as_ref().map_or((0.0, 0.0, 0.0), |(r, o)| (*r, o.forward.sent_pps(), o.forward.received_pps()));
    let problems = best.as_ref().map(|(_, o)| o.problems).unwrap_or_default();
    let result = object([
        ("rate_pps", json!(offered(rate, sent))),
        ("requested_pps", json!(rate)),
        ("offered_pps", json!(sent)),
        ("received_pps", json!(received)),
        ("problems", json!(problems)),
        ("direction", json!(if s.bidirectional { "both" } else { "forward" })),
        ("probes", json!(found.probes)),
    ]);
    let limited = found.failed_at.is_none() || short_of(rate, sent) || tester_failed;
    let l = line(tb, "throughput", "RFC 2544", frame_size, s.flows.into(), s.criterion, result, limited);
    Ok((l, best.map(|(_, o)| offered(rate, o.forward.sent_pps()))))
}

/// RFC 2544 section 26.3: loss at the maximum rate, then at each 10% less,
/// until two successive trials lose nothing.
pub fn frame_loss(tb: &mut dyn Testbed, s: &Settings, frame_size: usize) -> Result<Vec<Line>, TestError> {
    establish(tb, s)?;
    let mut lines = Vec::new();
    let mut clean_in_a_row = 0;
    for step in 0..10u32 {
        let rate = s.max_rate * (1.0 - 0.1 * f64::from(step));
        let o = phase2_trial(tb, s, frame_size, rate, s.trial_ns, s.seed + 100 + u64::from(step))?;
        let loss = loss_of(&o, s);
        // RFC 2544 reports loss against the rate offered: what was sent,
        // which the generator's ceiling can hold below what was asked.
        let result = object([
            ("rate_pps", json!(offered(rate, o.forward.sent_pps()))),
            ("requested_pps", json!(rate)),
            ("offered_pps", json!(o.forward.sent_pps())),
            ("received_pps", json!(o.forward.received_pps())),
            ("loss", json!(loss)),
        ]);
        lines.push(line(tb, "frame_loss", "RFC 2544", frame_size, s.flows.into(), met(Criterion::Zero, loss), result, tester_limited(rate, &o)));
        clean_in_a_row = if loss == 0.0 { clean_in_a_row + 1 } else { 0 };
        if clean_in_a_row == 2 {
            break;
        }
    }
    Ok(lines)
}

/// RFC 8219 sections 7.2 and 7.3 at the throughput rate, from one trial:
/// typical (median) and worst-case (99.9th percentile) latency, and PDV.
pub fn latency_and_pdv(tb: &mut dyn Testbed, s: &Settings, frame_size: usize, rate: f64) -> Result<(Vec<Line>, Vec<u32>), TestError> {
    establish(tb, s)?;
    let mut plan = phase2_plan(s, frame_size, rate, s.latency_ns, s.seed + 200);
    plan.keep_latencies = true;
    let mut o = tb.trial(&plan)?;
    let loss = o.forward.loss();
    let mut delays = std::mem::take(&mut o.forward.latencies_ns);
    let Some(sum) = Summary::of(&mut delays) else {
        return Err(TestError::Setup(format!("no frame came through at {:.1} kpps: no latency to report", rate / 1e3)));
    };
    tb.note(&format!("latency at {:.1} kpps: median {:.1} us, 99.9th percentile {:.1} us, loss {:.4}%", rate / 1e3, sum.median_us, sum.p999_us, loss * 100.0));
    let limited = tester_limited(rate, &o);
    let offered_pps = offered(rate, o.forward.sent_pps());
    let latency = object([
        ("rate_pps", json!(offered_pps)),
        ("requested_pps", json!(rate)),
        ("median_us", json!(sum.median_us)),
        ("p999_us", json!(sum.p999_us)),
        ("min_us", json!(sum.min_us)),
        ("p99_us", json!(sum.p99_us)),
        ("max_us", json!(sum.max_us)),
        ("samples", json!(sum.samples)),
        ("loss", json!(loss)),
        ("problems", json!(o.problems)),
    ]);
    let pdv_us = stats::pdv(&delays).map_or(Value::Null, |ns| json!(f64::from(ns) / 1e3));
    let pdv = object([("rate_pps", json!(offered_pps)), ("requested_pps", json!(rate)), ("pdv_us", pdv_us), ("samples", json!(sum.samples)), ("loss", json!(loss))]);
    let lines = vec![
        line(tb, "latency", "RFC 8219", frame_size, s.flows.into(), met(s.criterion, loss), latency, limited),
        line(tb, "pdv", "RFC 8219", frame_size, s.flows.into(), met(s.criterion, loss), pdv, limited),
    ];
    Ok((lines, delays))
}

/// Seed 002's goodput, RTT and jitter at each rung of its ladder: the
/// responder sends every frame back, as bwping's echo did.
pub fn goodput(tb: &mut dyn Testbed, s: &Settings, ladder: &[Rung]) -> Result<Vec<Line>, TestError> {
    establish(tb, s)?;
    let mut lines = Vec::new();
    for (i, rung) in ladder.iter().enumerate() {
        let rate = rung.rate();
        let frames = rate.frames_in(s.goodput_ns).max(2);
        let mut plan = TrialPlan::new(Kind::Udp { frame_size: rung.frame_size() });
        plan.forward = Some(Stream { pick: Pick::Random { conns: s.flows, seed: s.seed + 300 + i as u64 }, rate, frames, burst: 1 });
        plan.reflect = true;
        plan.keep_latencies = true;
        plan.drain_ns = s.drain_ns;
        let mut o = tb.trial(&plan)?;
        // Measured at the destination, as seed 002's receiver did: over
        // the time the frames took to arrive, not the time asked for.
        let seconds = o.forward.receiving_seconds().unwrap_or(frames as f64 / rate.as_pps());
        let rtt = Summary::of(&mut o.returned.latencies_ns);
        let result = object([
            ("offered_mbps", json!(rung.mbps)),
            ("rate_pps", json!(rate.as_pps())),
            ("sent_pps", json!(o.forward.sent_pps())),
            ("goodput_mbps", json!(o.forward.payload_bytes as f64 * 8.0 / seconds / 1e6)),
            ("delivered_mbps", json!(o.forward.received as f64 * rung.bytes as f64 * 8.0 / seconds / 1e6)),
            ("rtt_ms", json!(rtt.map(|r| r.mean_us / 1e3))),
            ("rtt_median_ms", json!(rtt.map(|r| r.median_us / 1e3))),
            ("jitter_ms", json!(o.forward.jitter_ns / 1e6)),
            ("loss", json!(o.forward.loss())),
            ("returned_loss", json!(1.0 - o.returned.received as f64 / o.forward.sent.max(1) as f64)),
            ("seed002_frame_bytes", json!(rung.bytes)),
        ]);
        tb.note(&format!("seed 002: {} B at {} Mbit/s: loss {:.3}%", rung.bytes, rung.mbps, o.forward.loss() * 100.0));
        lines.push(line(tb, "goodput", "seed 002", rung.frame_size(), s.flows.into(), met(Criterion::Zero, o.forward.loss()), result, tester_limited(rate.as_pps(), &o)));
    }
    Ok(lines)
}

/// CPU time per forwarded frame at a fixed rate both devices sustain: the
/// whole machine's busy time and the device's own. Figures of whole CPUs
/// are less what those spent in a quiet spell before (other tenants of a
/// shared CPU); a device's own threads are charged all their time, their
/// idle polling too.
pub fn cpu_cost(tb: &mut dyn Testbed, s: &Settings) -> Result<Option<Line>, TestError> {
    establish(tb, s)?;
    let Some(quiet_start) = tb.cpu() else { return Ok(None) };
    let quiet_from = std::time::Instant::now();
    std::thread::sleep(Duration::from_nanos(s.cpu_ns / 2));
    let Some(quiet_end) = tb.cpu() else { return Ok(None) };
    // As long as the spell really lasted: a loaded host oversleeps.
    let quiet_ns = quiet_from.elapsed().as_nanos().max(1) as f64;
    let background_per_ns = quiet_end.machine_busy_ns.saturating_sub(quiet_start.machine_busy_ns) as f64 / quiet_ns;
    let shared_background = quiet_end.dut_shared_ns.zip(quiet_start.dut_shared_ns).map_or(0.0, |(e, s)| e.saturating_sub(s) as f64 / quiet_ns);
    let plan = phase2_plan(&Settings { bidirectional: false, ..s.clone() }, CONNECTION_FRAME, s.cpu_rate, s.cpu_ns, s.seed + 400);
    let before = tb.cpu();
    let o = tb.trial(&plan)?;
    let after = tb.cpu();
    let (Some(before), Some(after)) = (before, after) else { return Ok(None) };
    let frames = o.forward.received.max(1) as f64;
    let busy = after.machine_busy_ns.saturating_sub(before.machine_busy_ns) as f64 - background_per_ns * o.elapsed_ns as f64;
    let elapsed = o.elapsed_ns as f64;
    let per_frame = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| (a.saturating_sub(b) as f64 - shared_background * elapsed).max(0.0) / frames);
    let dut = per_frame(after.dut_ns, before.dut_ns);
    let work = per_frame(after.dut_work_ns, before.dut_work_ns);
    let result = object([
        ("rate_pps", json!(s.cpu_rate)),
        ("forwarded", json!(o.forward.received)),
        ("loss", json!(o.forward.loss())),
        ("machine_ns_per_frame", json!(busy.max(0.0) / frames)),
        ("dut_ns_per_frame", json!(dut)),
        ("dut_work_ns_per_frame", json!(work)),
        ("background_cpus", json!(background_per_ns)),
    ]);
    Ok(Some(line(tb, "cpu", "natrix", CONNECTION_FRAME, s.flows.into(), met(Criterion::Zero, o.forward.loss()), result, tester_limited(s.cpu_rate, &o))))
}

/// Seed 003's synbomber: SYNs for new connections in bursts, every one a
/// 4-tuple never used before, answered by the responder (synbomber-reply)
/// with SYN-ACKs; how many were forwarded and answered, and how fast.
pub fn syn_flood(tb: &mut dyn Testbed, s: &Settings, rate: f64, burst: u32) -> Result<Line, TestError> {
    tb.reset()?;
    let mut plan = TrialPlan::new(Kind::Syn);
    plan.forward = Some(Stream { pick: Pick::Enumerate { conns: s.flows, seed: s.seed + 500 }, rate: Rate::pps(rate), frames: u64::from(s.flows), burst });
    plan.answer_syn = true;
    plan.keep_latencies = true;
    plan.drain_ns = s.drain_ns;
    let before = tb.cpu();
    let mut o = tb.trial(&plan)?;
    let after = tb.cpu();
    let handshake = Summary::of(&mut o.returned.latencies_ns);
    // Seed 003's "CPU load on TCP hacker": the device's share of one CPU
    // over the trial.
    let dut_load = before.zip(after).and_then(|(b, a)| a.dut_ns.zip(b.dut_ns)).map(|(a, b)| a.saturating_sub(b) as f64 / o.elapsed_ns.max(1) as f64);
    let result = object([
        ("rate_pps", json!(rate)),
        ("burst", json!(burst)),
        ("dut_cpu_share", json!(dut_load)),
        ("sent", json!(o.forward.sent)),
        ("forwarded", json!(o.forward.received)),
        ("answered", json!(o.returned.received)),
        ("median_us", json!(handshake.map(|h| h.median_us))),
        ("p999_us", json!(handshake.map(|h| h.p999_us))),
    ]);
    tb.note(&format!("SYN flood at {:.1} kpps in bursts of {burst}: {} of {} answered", rate / 1e3, o.returned.received, o.forward.sent));
    let unanswered = 1.0 - o.returned.received.min(o.forward.sent) as f64 / o.forward.sent.max(1) as f64;
    Ok(line(tb, "syn_flood", "seed 003", CONNECTION_FRAME, s.flows.into(), met(Criterion::Zero, unanswered), result, tester_limited(rate, &o)))
}

/// The generator's own accuracy on a link without a device: requested
/// against achieved rate, the gaps between frames as sent and as
/// received, and what arrived intact. A rate of infinity asks for the
/// generator's ceiling.
pub fn generator_accuracy(tb: &mut dyn Testbed, s: &Settings, rate: f64, ns: u64) -> Result<Line, TestError> {
    let ask = if rate.is_finite() { rate } else { 1e9 };
    let mut plan = phase2_plan(&Settings { bidirectional: false, ..s.clone() }, CONNECTION_FRAME, ask, ns, s.seed + 600);
    if !rate.is_finite() {
        // More frames than the generator can send in the time: it sends
        // flat out, and the ceiling is what it managed.
        plan.forward = plan.forward.map(|f| Stream { frames: Rate::pps(ask).frames_in(ns), ..f });
        plan.send_for_ns = Some(ns);
    }
    plan.keep_gaps = true;
    plan.keep_latencies = true;
    let mut o = tb.trial(&plan)?;
    let f = &mut o.forward;
    let gaps = |v: &mut Vec<u32>| Summary::of(v).map(|g| json!({"p1_us": percentile_us(v, 1.0), "median_us": g.median_us, "p99_us": g.p99_us, "max_us": g.max_us}));
    let tx_gaps = gaps(&mut f.tx_gaps_ns);
    let rx_gaps = gaps(&mut f.rx_gaps_ns);
    let sent = f.sent_pps();
    let result = object([
        ("rate_pps", if rate.is_finite() { json!(rate) } else { json!("max") }),
        ("sent_pps", json!(sent)),
        ("received_pps", json!(f.received_pps())),
        ("rate_error", json!(if rate.is_finite() { sent / rate - 1.0 } else { 0.0 })),
        ("ideal_gap_us", json!(if rate.is_finite() { 1e6 / rate } else { 0.0 })),
        ("tx_gap", json!(tx_gaps)),
        ("rx_gap", json!(rx_gaps)),
        ("loss", json!(f.loss())),
        ("intact", json!(f.received)),
        ("problems", json!(o.problems)),
        ("latency", json!(Summary::of(&mut f.latencies_ns))),
    ]);
    let asked = if rate.is_finite() { format!("{:.1} kpps", rate / 1e3) } else { "its most".into() };
    tb.note(&format!("generator: asked {asked}, sent {:.1} kpps, received {:.1} kpps", sent / 1e3, f.received_pps() / 1e3));
    let loss = o.forward.loss();
    Ok(line(tb, "generator", "natrix", CONNECTION_FRAME, s.flows.into(), met(Criterion::Zero, loss), result, false))
}

fn percentile_us(sorted: &[u32], pct: f64) -> Option<f64> {
    stats::percentile(sorted, pct).map(|ns| f64::from(ns) / 1e3)
}

#[allow(clippy::too_many_arguments)]
fn line(
    tb: &dyn Testbed,
    test: &'static str,
    method: &'static str,
    frame_size: usize,
    flows: u64,
    criterion: Criterion,
    result: serde_json::Map<String, Value>,
    generator_limited: bool,
) -> Line {
    Line { test, dut: tb.dut().to_owned(), frame_size, flows, criterion, method, result, generator_limited }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::DirectionReport;

    /// A fake NAT with known limits: it creates connections at up to
    /// `conn_rate` per second into a table of `capacity`, forwards up to
    /// `throughput` frames per second of existing connections, delays
    /// every frame by `delays` in turn, and deletes connections at a fixed
    /// cost each.
    struct FakeNat {
        capacity: u64,
        conn_rate: f64,
        throughput: f64,
        delays: Vec<u32>,
        held: u64,
        trials: usize,
        /// The most frames per second the fake generator gets out.
        generator_ceiling: f64,
        /// Above this rate the fake tester's own receive ring overflows: it
        /// loses a tenth of the frames itself.
        tester_receives: f64,
        /// A device CPU clock, where the fake has one.
        clock: Option<FakeCpu>,
    }

    /// CPU time spent at `background_per_ns` of real time (a quiet spell
    /// sleeps for real) and of the trials' time, plus `per_frame_ns` for
    /// each frame forwarded. The background is the device's own idling, or
    /// other tenants' time where it is in a shared part.
    struct FakeCpu {
        started: std::time::Instant,
        background_per_ns: f64,
        per_frame_ns: u64,
        trial_ns: u64,
        frames: u64,
        /// What of the clock is whole CPUs' time.
        shared: Shared,
    }

    #[derive(Clone, Copy, PartialEq)]
    enum Shared {
        /// The kernel's: whole CPUs, the background other tenants'.
        All,
        /// natrix's own threads: the background is their idle polling.
        None,
        /// natrix's threads with its links' receive work on its CPUs
        /// beside them: half of each frame's work is there, and as much
        /// background again, other tenants', on top of the threads' idling.
        ReceiveWork,
    }

    impl FakeCpu {
        fn wall_ns(&self) -> f64 {
            (self.started.elapsed().as_nanos() as u64 + self.trial_ns) as f64
        }

        /// The device's figure, and the part of it that is shared.
        fn spent_ns(&self) -> (u64, Option<u64>) {
            let own = (self.background_per_ns * self.wall_ns()) as u64 + self.per_frame_ns * self.frames;
            match self.shared {
                Shared::All => (own, Some(own)),
                Shared::None => (own, None),
                Shared::ReceiveWork => {
                    let receive = (self.background_per_ns * self.wall_ns()) as u64 + self.per_frame_ns / 2 * self.frames;
                    (own - self.per_frame_ns / 2 * self.frames + receive, Some(receive))
                }
            }
        }

        /// Everything the machine's CPUs spent: the device's and the
        /// tenants' time beside natrix's threads.
        fn machine_ns(&self) -> u64 {
            self.spent_ns().0
        }
    }

    impl FakeNat {
        fn new() -> FakeNat {
            FakeNat {
                capacity: 50_000,
                conn_rate: 123_000.0,
                throughput: 234_567.0,
                delays: (1..=1000).map(|i| i * 100).collect(),
                held: 0,
                trials: 0,
                generator_ceiling: f64::INFINITY,
                tester_receives: f64::INFINITY,
                clock: None,
            }
        }

        /// A direction of `frames` at `rate` of which `received` arrive.
        fn direction(&self, frames: u64, rate: f64, received: u64, keep: bool) -> DirectionReport {
            let rate = rate.min(self.generator_ceiling);
            let mut d = DirectionReport::default();
            (d.sent, d.received) = (frames, received);
            (d.first_tx_ns, d.last_tx_ns) = (1_000, 1_000 + ((frames - 1) as f64 * 1e9 / rate).round() as u64);
            (d.first_rx_ns, d.last_rx_ns) = (d.first_tx_ns + 50_000, d.last_tx_ns + 50_000);
            d.payload_bytes = received * 18;
            if keep {
                d.latencies_ns = (0..received as usize).map(|i| self.delays[i % self.delays.len()]).collect();
            }
            d
        }

        fn forwarded(&self, frames: u64, rate: f64) -> u64 {
            let rate = rate.min(self.generator_ceiling);
            if rate <= self.throughput {
                frames
            } else {
                (frames as f64 * self.throughput / rate) as u64
            }
        }
    }

    impl Testbed for FakeNat {
        fn dut(&self) -> &str {
            "fake"
        }

        fn reset(&mut self) -> Result<(), TestError> {
            self.held = 0;
            Ok(())
        }

        fn delete_all(&mut self) -> Result<Duration, TestError> {
            let d = Duration::from_micros(200 + self.held);
            self.held = 0;
            Ok(d)
        }

        fn trial(&mut self, plan: &TrialPlan) -> Result<TrialOutcome, TestError> {
            self.trials += 1;
            let mut o = TrialOutcome::default();
            if let Some(f) = plan.forward {
                let rate = f.rate.as_pps();
                let received = match f.pick {
                    Pick::Enumerate { conns, .. } => {
                        let fit = u64::from(conns).min(self.capacity);
                        self.held = if rate <= self.conn_rate { fit } else { (fit as f64 * self.conn_rate / rate) as u64 };
                        self.held
                    }
                    _ => self.forwarded(f.frames, rate),
                };
                if rate > self.tester_receives {
                    o.tester_dropped = received / 10;
                }
                o.forward = self.direction(f.frames, rate, received - o.tester_dropped, plan.keep_latencies);
                if let Some(clock) = &mut self.clock {
                    o.elapsed_ns = (f.frames as f64 * 1e9 / rate) as u64;
                    clock.trial_ns += o.elapsed_ns;
                    clock.frames += received;
                }
                if plan.reflect {
                    o.returned = self.direction(f.frames, rate, received, plan.keep_latencies);
                }
            }
            if let Some(r) = plan.reverse {
                let received = match r.pick {
                    Pick::Enumerate { conns, .. } => self.held.min(u64::from(conns)),
                    _ => self.forwarded(r.frames, r.rate.as_pps()),
                };
                o.reverse = self.direction(r.frames, r.rate.as_pps(), received, false);
            }
            Ok(o)
        }

        fn cpu(&mut self) -> Option<CpuTimes> {
            let clock = self.clock.as_ref()?;
            let (spent, shared) = clock.spent_ns();
            Some(CpuTimes { machine_busy_ns: clock.machine_ns(), dut_ns: Some(spent), dut_work_ns: Some(spent), dut_shared_ns: shared })
        }

        fn note(&mut self, _: &str) {}
    }

    fn settings() -> Settings {
        Settings {
            flows: 1_000,
            trial_ns: 1_000_000_000,
            latency_ns: 1_000_000_000,
            goodput_ns: 1_000_000_000,
            max_rate: 400_000.0,
            resolution: 1.0 / 256.0,
            fill_rate: 10_000.0,
            criterion: Criterion::Zero,
            capacity: CapacitySearch { start: 1_000, max: 1 << 20, precision: 500, beta: 0.2, gamma: 0.4 },
            bidirectional: false,
            drain_ns: 0,
            teardown_repeats: 3,
            cpu_rate: 10_000.0,
            cpu_ns: 1_000_000,
            seed: 1,
        }
    }

    fn within_one_step(found: f64, limit: f64, s: &Settings) {
        let step = s.max_rate * s.resolution;
        assert!(found <= limit + 1.0 && limit - found <= step + 1.0, "found {found}, limit {limit}, step {step}");
    }

    /// CPU per frame of a device busy 10% of the time between trials and
    /// 20 µs per frame: `shared` says whether that 10% is other tenants'.
    fn cpu_line(shared: Shared) -> Line {
        let s = Settings { cpu_ns: 40_000_000, ..settings() };
        let mut nat = FakeNat::new();
        nat.clock = Some(FakeCpu { started: std::time::Instant::now(), background_per_ns: 0.1, per_frame_ns: 20_000, trial_ns: 0, frames: 0, shared });
        cpu_cost(&mut nat, &s).unwrap().expect("the fake has a CPU clock")
    }

    fn ns_per_frame(line: &Line, field: &str) -> f64 {
        line.result[field].as_f64().unwrap()
    }

    /// Whole CPUs' time (the kernel's) is less the quiet spell's
    /// background, which at 10% adds 10 µs a frame over this trial; the
    /// machine's always is.
    #[test]
    fn cpu_per_frame_of_whole_cpus_leaves_out_their_quiet_background() {
        let line = cpu_line(Shared::All);
        for field in ["dut_ns_per_frame", "dut_work_ns_per_frame", "machine_ns_per_frame"] {
            let ns = ns_per_frame(&line, field);
            assert!((19_000.0..21_000.0).contains(&ns), "{field}: {ns} ns per frame, not the 20,000 of work");
        }
        assert!((0.09..0.12).contains(&line.result["background_cpus"].as_f64().unwrap()));
    }

    /// A device's own threads (natrix's) are charged their idle time too.
    #[test]
    fn cpu_per_frame_of_a_devices_own_threads_keeps_their_idle_time() {
        let line = cpu_line(Shared::None);
        for field in ["dut_ns_per_frame", "dut_work_ns_per_frame"] {
            let ns = ns_per_frame(&line, field);
            assert!((29_000.0..31_000.0).contains(&ns), "{field}: {ns} ns per frame, not 20,000 of work and 10,000 of idling");
        }
        let machine = ns_per_frame(&line, "machine_ns_per_frame");
        assert!((19_000.0..21_000.0).contains(&machine), "machine: {machine}");
    }

    /// natrix's links' receive work on its own CPUs (no NAPI threads) is
    /// whole CPUs' time: other tenants' time there is taken off as the
    /// kernel's is, its threads' idling is not.
    #[test]
    fn cpu_per_frame_leaves_out_other_tenants_beside_a_devices_own_threads() {
        let line = cpu_line(Shared::ReceiveWork);
        for field in ["dut_ns_per_frame", "dut_work_ns_per_frame"] {
            let ns = ns_per_frame(&line, field);
            assert!((29_000.0..31_000.0).contains(&ns), "{field}: {ns} ns per frame, not 20,000 of work and 10,000 of idling");
        }
    }

    #[test]
    fn throughput_of_a_device_that_drops_above_a_known_rate_is_found_within_one_step() {
        let (s, mut nat) = (settings(), FakeNat::new());
        let (l, rate) = throughput(&mut nat, &s, 64).unwrap();
        within_one_step(l.result["rate_pps"].as_f64().unwrap(), nat.throughput, &s);
        within_one_step(rate.unwrap(), nat.throughput, &s);
        assert!(!l.generator_limited);
        assert_eq!(l.to_json()["criterion"], json!("zero"));
    }

    #[test]
    fn throughput_both_ways_and_with_a_loss_criterion() {
        let mut s = Settings { bidirectional: true, ..settings() };
        let mut nat = FakeNat::new();
        let (l, _) = throughput(&mut nat, &s, 1518).unwrap();
        within_one_step(l.result["rate_pps"].as_f64().unwrap(), nat.throughput, &s);
        assert_eq!(l.result["direction"], json!("both"));
        // Allowing 1% loss finds the rate at which 1% is lost.
        s.criterion = Criterion::Fraction(0.01);
        let (l, _) = throughput(&mut nat, &s, 64).unwrap();
        within_one_step(l.result["rate_pps"].as_f64().unwrap(), nat.throughput / 0.99, &s);
    }

    #[test]
    fn a_device_faster_than_the_generator_is_reported_as_generator_limited() {
        let s = settings();
        let mut nat = FakeNat { throughput: 1e9, ..FakeNat::new() };
        let (l, _) = throughput(&mut nat, &s, 64).unwrap();
        assert!(l.generator_limited);
        assert_eq!(l.result["rate_pps"].as_f64().unwrap().round(), s.max_rate);
    }

    /// RFC 2544 section 26.1 throughput is the device's only where the
    /// tester lost nothing itself: a search its own losses stopped says so.
    #[test]
    fn a_search_the_testers_own_losses_stopped_is_reported_as_generator_limited() {
        let s = settings();
        let mut nat = FakeNat { tester_receives: 100_000.0, ..FakeNat::new() };
        let (l, _) = throughput(&mut nat, &s, 64).unwrap();
        within_one_step(l.result["rate_pps"].as_f64().unwrap(), 100_000.0, &s);
        assert!(l.generator_limited, "the rate found is the tester's limit");
        let l = connection_rate(&mut nat, &s).unwrap();
        within_one_step(l.result["rate_pps"].as_f64().unwrap(), 100_000.0, &s);
        assert!(l.generator_limited);
        let lines = frame_loss(&mut nat, &s, 64).unwrap();
        assert!(lines[0].generator_limited && lines[0].result["loss"].as_f64().unwrap() > 0.0);
        // Below its limit nothing is flagged.
        let mut nat = FakeNat { tester_receives: 1e9, ..FakeNat::new() };
        assert!(!throughput(&mut nat, &s, 64).unwrap().0.generator_limited);
    }

    /// Reverse frames never sent, their connection's endpoint unknown to
    /// the responder, are the device's loss all the same.
    #[test]
    fn reverse_frames_to_connections_never_learned_count_as_lost() {
        let mut o = TrialOutcome::default();
        (o.reverse.sent, o.reverse.received, o.unlearned) = (90, 90, 10);
        let s = Settings { bidirectional: true, ..settings() };
        assert!((loss_of(&o, &s) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn connection_rate_is_found_within_one_step() {
        let (s, mut nat) = (settings(), FakeNat::new());
        let l = connection_rate(&mut nat, &s).unwrap();
        within_one_step(l.result["rate_pps"].as_f64().unwrap(), nat.conn_rate, &s);
        assert_eq!(l.test, "connection_rate");
    }

    #[test]
    fn table_capacity_is_found_within_the_precision() {
        let (s, mut nat) = (settings(), FakeNat::new());
        let (l, points) = table_capacity(&mut nat, &s, 200_000.0).unwrap();
        let flows = l.result["flows"].as_u64().unwrap();
        assert!(flows <= nat.capacity && nat.capacity - flows <= s.capacity.precision, "{flows}");
        assert_eq!(l.flows, flows);
        assert!(points.iter().any(|&(c, r)| c > nat.capacity && r == 0.0));
    }

    #[test]
    fn teardown_rate_subtracts_the_empty_tables_time() {
        let (s, mut nat) = (settings(), FakeNat::new());
        let l = teardown_rate(&mut nat, &s).unwrap();
        // 1,000 connections cost 1,000 us over the empty table's 200 us.
        assert_eq!(l.result["rate_cps"].as_f64().unwrap().round(), 1_000_000.0);
    }

    #[test]
    fn frame_loss_steps_down_by_ten_percent_until_two_clean_trials() {
        let (s, mut nat) = (settings(), FakeNat::new());
        let lines = frame_loss(&mut nat, &s, 64).unwrap();
        let rates: Vec<f64> = lines.iter().map(|l| l.result["rate_pps"].as_f64().unwrap().round()).collect();
        // 400k .. 240k lose frames (above 234,567); 200k and 160k do not.
        assert_eq!(rates, vec![400_000.0, 360_000.0, 320_000.0, 280_000.0, 240_000.0, 200_000.0, 160_000.0]);
        let first = lines[0].result["loss"].as_f64().unwrap();
        assert!((first - (1.0 - 234_567.0 / 400_000.0)).abs() < 1e-4, "{first}");
        assert_eq!(lines[6].result["loss"].as_f64(), Some(0.0));
    }

    #[test]
    fn frame_loss_is_reported_against_the_rate_really_offered() {
        // The generator gets out 380k of the 400k asked at the first step.
        let (s, mut nat) = (settings(), FakeNat { generator_ceiling: 380_000.0, ..FakeNat::new() });
        let lines = frame_loss(&mut nat, &s, 64).unwrap();
        let first = &lines[0].result;
        assert_eq!(first["rate_pps"].as_f64().unwrap().round(), 380_000.0);
        assert_eq!(first["requested_pps"].as_f64(), Some(400_000.0));
        assert!((first["loss"].as_f64().unwrap() - (1.0 - 234_567.0 / 380_000.0)).abs() < 1e-4);
        assert!(lines[0].generator_limited);
    }

    #[test]
    fn lines_that_lost_frames_do_not_claim_zero_loss() {
        let (s, mut nat) = (settings(), FakeNat::new());
        // Above the fake's throughput: frames are lost.
        let (lines, _) = latency_and_pdv(&mut nat, &s, 64, 300_000.0).unwrap();
        let loss = lines[0].result["loss"].as_f64().unwrap();
        assert!(loss > 0.0);
        assert!(lines.iter().all(|l| l.criterion == Criterion::Fraction(loss)), "{:?}", lines[0].criterion);
        let lines = frame_loss(&mut nat, &s, 64).unwrap();
        assert_eq!(lines[0].criterion, Criterion::Fraction(lines[0].result["loss"].as_f64().unwrap()));
        assert_eq!(lines.last().unwrap().criterion, Criterion::Zero);
        // The fake answers no SYN: a flood with every SYN unanswered.
        assert_eq!(syn_flood(&mut nat, &s, 100_000.0, 8).unwrap().criterion, Criterion::Fraction(1.0));
        // Within the run's criterion, the line carries it.
        let s = Settings { criterion: Criterion::Fraction(0.5), ..settings() };
        let (lines, _) = latency_and_pdv(&mut nat, &s, 64, 300_000.0).unwrap();
        assert_eq!(lines[0].criterion, Criterion::Fraction(0.5));
    }

    #[test]
    fn latency_and_pdv_per_rfc_8219() {
        let (s, mut nat) = (settings(), FakeNat::new());
        let (lines, delays) = latency_and_pdv(&mut nat, &s, 64, 100_000.0).unwrap();
        // Delays 0.1 .. 100 us evenly: median 50.05 us, 99.9th percentile 99.9 us.
        assert_eq!(lines[0].result["median_us"].as_f64(), Some(50.05));
        assert_eq!(lines[0].result["p999_us"].as_f64(), Some(99.9));
        assert_eq!(lines[1].test, "pdv");
        assert!((lines[1].result["pdv_us"].as_f64().unwrap() - 99.8).abs() < 1e-9);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn goodput_follows_seed_002s_ladder() {
        let (s, mut nat) = (settings(), FakeNat::new());
        let lines = goodput(&mut nat, &s, &crate::seed002::LADDER).unwrap();
        assert_eq!(lines.len(), 10);
        assert!(lines.iter().all(|l| l.method == "seed 002" && l.result.contains_key("rtt_ms") && l.result.contains_key("jitter_ms")));
        assert_eq!(lines[0].frame_size, 132);
        assert_eq!(lines[9].frame_size, 1518);
    }

    /// Goodput is what arrived over the time it took to arrive: a device
    /// (or generator) slower than the rung asked for shows in it, loss or
    /// not.
    #[test]
    fn goodput_is_measured_over_the_time_the_frames_took_to_arrive() {
        let s = settings();
        let rung = crate::seed002::LADDER[0];
        let full = goodput(&mut FakeNat::new(), &s, &[rung]).unwrap()[0].result["goodput_mbps"].as_f64().unwrap();
        let slow = FakeNat { generator_ceiling: rung.rate().as_pps() / 2.0, ..FakeNat::new() };
        let half = goodput(&mut { slow }, &s, &[rung]).unwrap()[0].result["goodput_mbps"].as_f64().unwrap();
        // The fake's frames carry 18 bytes of payload each.
        let asked = rung.rate().as_pps() * 18.0 * 8.0 / 1e6;
        assert!((full / asked - 1.0).abs() < 0.01, "{full} against {asked}");
        assert!((half / full - 0.5).abs() < 0.01, "{half} against {full}");
    }

    #[test]
    fn a_failing_preliminary_phase_stops_a_test_with_a_reason() {
        let mut s = settings();
        // Above the connection rate even after halving twice.
        s.fill_rate = 600_000.0;
        let mut nat = FakeNat::new();
        let e = throughput(&mut nat, &s, 64).unwrap_err();
        assert!(e.to_string().contains("preliminary phase failed"), "{e}");
    }

    #[test]
    fn a_fill_that_fails_is_tried_again_slower() {
        let mut s = settings();
        // Above the connection rate; half of it is below.
        s.fill_rate = 200_000.0;
        let mut nat = FakeNat::new();
        assert!(establish(&mut nat, &s).is_ok());
    }

    #[test]
    fn a_preliminary_phase_that_lost_a_few_connections_is_validated_under_a_loss_criterion() {
        // A table 5 short of the 1,000 connections: 0.5% lost.
        let mut nat = FakeNat { capacity: 995, ..FakeNat::new() };
        let s = Settings { criterion: Criterion::Fraction(0.01), ..settings() };
        let p = preliminary(&mut nat, &s, 1_000, 10_000.0).unwrap();
        assert_eq!((p.created, p.validated), (995, 995));
        assert!(p.passed(s.criterion));
        let s = Settings { criterion: Criterion::Zero, ..settings() };
        assert!(!preliminary(&mut nat, &s, 1_000, 10_000.0).unwrap().passed(s.criterion));
    }

    #[test]
    fn a_loss_criterion_lets_a_preliminary_phase_pass_with_that_share_lost() {
        let p = Preliminary { conns: 10_000, requested_pps: 1.0, sent_pps: 1.0, created: 9_995, validated: 9_991, tester_dropped: 0 };
        assert!(!p.passed(Criterion::Zero));
        assert!(p.passed(Criterion::Fraction(0.001)));
        assert!(!p.passed(Criterion::Fraction(0.0005)));
    }
}
