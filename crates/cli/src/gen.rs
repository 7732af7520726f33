//! `natrix gen`: the tester's traffic generator on its own. It sends test
//! frames on an interface (AF_XDP, else AF_PACKET) at a constant rate
//! without cumulative error, or writes them to a capture, or receives a
//! generator's frames and counts, times and checks them.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use natrix_io::OneSideCapture;
use natrix_tester::engine::{render, AddrRange, DirectionReport, Expect, Kind, Link, Pick, Stream, Tester, TrialOutcome, TrialPlan};
use natrix_tester::flows::FlowSpace;
use natrix_tester::frame::{MAX_FRAME_SIZE, MIN_FRAME_SIZE};
use natrix_tester::pacing::Rate;
use natrix_tester::ports::{self, Io, Unconnected};
use natrix_tester::stats::Summary;
use natrix_tester::sys::{exact_timers, in_netns, now_ns};
use serde_json::json;

use crate::Failure;

#[derive(clap::Args)]
pub struct Args {
    /// Send on this interface (AF_XDP, else AF_PACKET); answers that come back on it are counted.
    #[arg(long, value_name = "IF", required_unless_present = "out")]
    interface: Option<String>,
    /// Write the frames to this capture, each stamped with its due time, instead of sending them: a classic
    /// pcap (nanosecond time stamps) where FILE ends in .pcap, else pcapng.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["interface", "receive"])]
    out: Option<PathBuf>,
    /// Open the interface inside this network namespace (a name from `ip netns`).
    #[arg(long, value_name = "NS")]
    netns: Option<String>,
    /// Frames per second.
    #[arg(long, default_value_t = 10_000.0)]
    rate: f64,
    /// Seconds to send (or, with --receive, to listen).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Frame size in bytes as RFC 2544 counts it, FCS included (64 to 1518): 4 bytes fewer are written.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Flows the frames are drawn from at random, with RFC 4814 pseudorandom ports.
    #[arg(long, default_value_t = 1000)]
    flows: u32,
    /// Share of the frames that each open a new flow, never used before (0 to 1); the rest use the --flows flows.
    #[arg(long, default_value_t = 0.0)]
    new_flows: f64,
    /// Frames sent back to back at each due time (the mean rate stays --rate).
    #[arg(long, default_value_t = 1)]
    burst: u32,
    /// Send TCP SYNs, each opening a new connection, as seed 003's synbomber; SYN-ACKs and RSTs that come back are counted.
    #[arg(long)]
    syn: bool,
    /// The next hop's MAC address, where frames go (default: broadcast).
    #[arg(long, value_name = "MAC")]
    dst_mac: Option<String>,
    /// The first source (subscriber) address; --subscribers addresses count up from it, and ARP is answered for them.
    #[arg(long, default_value = "100.64.1.1")]
    src: Ipv4Addr,
    #[arg(long, default_value_t = 16)]
    subscribers: u32,
    /// The destination (server) address.
    #[arg(long, default_value = "198.51.100.21")]
    dst: Ipv4Addr,
    /// Destination ports, counting up from 5001.
    #[arg(long, default_value_t = 64)]
    dports: u32,
    /// Packet backend.
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = ["auto", "af_xdp", "af_packet"])]
    io: String,
    /// Receive instead: count, time and check tagged frames arriving on --interface for --dst (answering ARP for it and
    /// SYNs with SYN-ACKs, as seed 003's synbomber-reply).
    #[arg(long)]
    receive: bool,
    /// With --receive: send every UDP frame back to where it came from (towards --dst-mac), for round-trip times.
    #[arg(long, requires = "receive")]
    reflect: bool,
    /// With --receive: routers between generator and receiver (each takes one off the TTL).
    #[arg(long, default_value_t = 1, requires = "receive")]
    hops: u8,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> Result<(), Failure> {
    check(args)?;
    let flows =
        FlowSpace { first_subscriber: u32::from(args.src), subscribers: args.subscribers, first_sport: 1024, server: u32::from(args.dst), first_dport: 5001, dports: args.dports };
    let dst_mac = args.dst_mac.as_deref().map(parse_mac).transpose()?.unwrap_or([0xff; 6]);
    match (&args.out, &args.interface) {
        (Some(out), _) => write_capture(args, flows, dst_mac, out),
        (None, Some(interface)) if args.receive => receive(args, flows, dst_mac, interface),
        (None, Some(interface)) => send(args, flows, dst_mac, interface),
        (None, None) => Err(Failure::Usage("natrix gen needs --interface or --out".into())),
    }
}

fn check(args: &Args) -> Result<(), Failure> {
    if !(MIN_FRAME_SIZE..=MAX_FRAME_SIZE).contains(&args.size) {
        return Err(Failure::Usage(format!("--size {}: frames are {MIN_FRAME_SIZE} to {MAX_FRAME_SIZE} bytes (RFC 2544 sizes, FCS included)", args.size)));
    }
    if args.syn && args.size != MIN_FRAME_SIZE {
        return Err(Failure::Usage("--syn sends 64-byte SYNs: leave --size out".into()));
    }
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !positive(args.rate) || !positive(args.duration) {
        return Err(Failure::Usage("--rate and --duration must be positive".into()));
    }
    if !(0.0..=1.0).contains(&args.new_flows) {
        return Err(Failure::Usage(format!("--new-flows {}: a share of the frames, 0 to 1", args.new_flows)));
    }
    if args.flows == 0 || args.subscribers == 0 || args.dports == 0 || u64::from(args.dports) + 5000 > 49151 {
        return Err(Failure::Usage("--flows, --subscribers and --dports must be positive, and destination ports stay below 49152 (RFC 4814)".into()));
    }
    Ok(())
}

pub fn parse_mac(s: &str) -> Result<[u8; 6], Failure> {
    let bytes: Vec<u8> = s.split(':').map(|b| u8::from_str_radix(b, 16)).collect::<Result<_, _>>().map_err(|_| Failure::Usage(format!("{s:?} is not a MAC address")))?;
    bytes.try_into().map_err(|_| Failure::Usage(format!("{s:?} is not a MAC address (six bytes, aa:bb:cc:dd:ee:ff)")))
}

fn io_choice(io: &str) -> Io {
    match io {
        "af_xdp" => Io::AfXdp,
        "af_packet" => Io::AfPacket,
        _ => Io::Auto,
    }
}

/// The stream the arguments describe.
fn stream(args: &Args) -> Stream {
    let rate = Rate::pps(args.rate);
    let frames = rate.frames_in((args.duration * 1e9) as u64).max(1);
    let pick = if args.syn {
        // Every SYN a connection never tried before (seed 003: the
        // synbomber never repeats a request).
        Pick::Enumerate { conns: u32::try_from(frames).unwrap_or(u32::MAX), seed: now_ns() }
    } else if args.new_flows > 0.0 {
        Pick::Mix { established: args.flows, first_new: args.flows, new_share: args.new_flows, seed: now_ns() }
    } else {
        Pick::Random { conns: args.flows, seed: now_ns() }
    };
    Stream { pick, rate, frames, burst: args.burst }
}

fn kind(args: &Args) -> Kind {
    if args.syn {
        Kind::Syn
    } else {
        Kind::Udp { frame_size: args.size }
    }
}

fn write_capture(args: &Args, flows: FlowSpace, dst_mac: [u8; 6], out: &std::path::Path) -> Result<(), Failure> {
    let mut capture = OneSideCapture::create(out).map_err(|e| Failure::Other(e.to_string()))?;
    let s = stream(args);
    let src_mac = [0x02, 0, 0, 0, 0, 0x01];
    let started = now_ns();
    let epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    render(kind(args), s, flows, (src_mac, dst_mac), epoch, |t, f| capture.write(t, f)).map_err(|e| Failure::Other(e.to_string()))?;
    let format = capture.format();
    capture.finish().map_err(|e| Failure::Other(e.to_string()))?;
    let took = (now_ns() - started) as f64 / 1e9;
    let built = s.frames as f64 / took;
    if args.json {
        println!("{}", json!({"out": out, "format": format, "frames": s.frames, "rate_pps": args.rate, "seconds": s.frames as f64 / args.rate, "generated_pps": built}));
    } else {
        println!(
            "wrote {} frames to {} ({format}) at {} frames/s of capture time ({:.1} s); generated at {:.0} frames/s",
            s.frames,
            out.display(),
            args.rate,
            s.frames as f64 / args.rate,
            built
        );
    }
    Ok(())
}

/// Opens `interface`, in `--netns` when given.
fn open(args: &Args, interface: &str) -> Result<ports::Opened, Failure> {
    let open = || ports::open(interface, io_choice(&args.io));
    let opened = match &args.netns {
        Some(ns) => in_netns(ns, open).map_err(|e| Failure::Other(format!("network namespace {ns}: {e}")))?,
        None => open(),
    };
    let opened = opened.map_err(|e| Failure::Other(e.to_string()))?;
    if let Some(why) = &opened.fallback {
        eprintln!("natrix gen: {why}");
    }
    Ok(opened)
}

fn send(args: &Args, flows: FlowSpace, dst_mac: [u8; 6], interface: &str) -> Result<(), Failure> {
    let port = open(args, interface)?;
    let subscribers = AddrRange { first: flows.first_subscriber, count: flows.subscribers };
    let initiator = Link { port: port.port, mac: port.mac, gateway_mac: dst_mac, answers_arp_for: vec![subscribers] };
    let nowhere = Link { port: Box::new(Unconnected), mac: [0; 6], gateway_mac: [0; 6], answers_arp_for: Vec::new() };
    let mut tester = Tester::new(initiator, nowhere, flows, Expect::NAT);
    exact_timers();
    let mut plan = TrialPlan::new(kind(args));
    plan.forward = Some(stream(args));
    plan.keep_latencies = true;
    let o = tester.run(&plan).map_err(|e| Failure::Other(e.to_string()))?;
    report_sent(args, &o);
    Ok(())
}

fn report_sent(args: &Args, o: &TrialOutcome) {
    let f = &o.forward;
    let mut answers = o.returned.clone();
    let answer_times = Summary::of(&mut answers.latencies_ns);
    if args.json {
        let v = json!({
            "rate_pps": args.rate,
            "sent": f.sent,
            "sent_pps": f.sent_pps(),
            "rate_error": f.sent_pps() / args.rate - 1.0,
            "tx_full": o.tx_full,
            "answered": answers.received,
            "answer_time": answer_times,
        });
        println!("{v}");
        return;
    }
    println!("sent {} frames at {:.1} frames/s (asked {}, {:+.3}%)", f.sent, f.sent_pps(), args.rate, (f.sent_pps() / args.rate - 1.0) * 100.0);
    if answers.received > 0 {
        let median = answer_times.map_or(f64::NAN, |s| s.median_us);
        println!("{} answered (SYN-ACK or RST, or reflected), median after {median:.1} us", answers.received);
    }
}

fn receive(args: &Args, flows: FlowSpace, dst_mac: [u8; 6], interface: &str) -> Result<(), Failure> {
    let port = open(args, interface)?;
    let responder = Link { port: port.port, mac: port.mac, gateway_mac: dst_mac, answers_arp_for: vec![AddrRange::single(flows.server)] };
    let nowhere = Link { port: Box::new(Unconnected), mac: [0; 6], gateway_mac: [0; 6], answers_arp_for: Vec::new() };
    let expect = Expect { hops: args.hops, translated: false, any_trial: true };
    let mut tester = Tester::new(nowhere, responder, flows, expect);
    let mut plan = TrialPlan::new(kind(args));
    plan.reflect = args.reflect;
    plan.answer_syn = true;
    plan.keep_latencies = true;
    plan.drain_ns = (args.duration * 1e9) as u64;
    let o = tester.run(&plan).map_err(|e| Failure::Other(e.to_string()))?;
    report_received(args, &o.forward, &o);
    Ok(())
}

fn report_received(args: &Args, f: &DirectionReport, o: &TrialOutcome) {
    let mut delays = f.latencies_ns.clone();
    let latency = Summary::of(&mut delays);
    let expected = f.highest_seq().map_or(0, |h| u64::from(h) + 1);
    if args.json {
        let v = json!({
            "received": f.received,
            "received_pps": f.received_pps(),
            "expected": expected,
            "duplicates": f.duplicates,
            "reordered": f.reordered,
            "latency": latency,
            "jitter_us": f.jitter_ns / 1e3,
            "problems": o.problems,
        });
        println!("{v}");
        return;
    }
    println!(
        "received {} frames at {:.1} frames/s; {} expected from the sequence numbers, {} duplicates, {} reordered",
        f.received,
        f.received_pps(),
        expected,
        f.duplicates,
        f.reordered
    );
    if let Some(l) = latency {
        println!("latency (sender's clock, same host): median {:.1} us, 99.9th percentile {:.1} us; jitter {:.1} us", l.median_us, l.p999_us, f.jitter_ns / 1e3);
    }
    if o.problems.total() > 0 {
        println!("problems: {:?}", o.problems);
    }
}
