//! The `natrix` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod check_config;
mod lab;
mod pcp;
mod replay;
mod run;
mod show;
mod whois;

#[derive(Parser)]
#[command(name = "natrix", version, about = "natrix: a software carrier-grade NAT (NAPT44)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a configuration file: exit 0 if valid, else name the key and the problem.
    CheckConfig {
        /// The TOML configuration file.
        file: PathBuf,
    },
    /// Run the engine over a capture (pcap or pcapng) and write the translated frames as pcapng.
    Replay(replay::Args),
    /// Measure the engine's speed and memory on generated 64-byte frames (new and established flows).
    Bench(bench::Args),
    /// A lab of network namespaces on this machine: `up`, `down`, or (default) a demo with real traffic through natrix.
    Lab(lab::Args),
    /// Run the NAT live on the configured interfaces, in the foreground.
    Run(run::Args),
    /// Show a running natrix's sessions, mappings or statistics.
    Show(show::ShowArgs),
    /// Remove a subscriber's sessions and mappings from a running natrix.
    Clear(show::ClearArgs),
    /// Who held an external address and port at a given time: from the event log or a deterministic config.
    Whois(whois::Args),
    /// A PCP (RFC 6887) client: ask a PCP server for a MAP or PEER mapping, or for an ANNOUNCE.
    Pcp(pcp::Args),
}

fn main() -> ExitCode {
    restore_default_sigpipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::CheckConfig { file } => check_config::run(&file),
        Command::Replay(args) => replay::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Lab(args) => lab::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Show(args) => show::show(&args),
        Command::Clear(args) => show::clear(&args),
        Command::Whois(args) => whois::run(&args),
        Command::Pcp(args) => pcp::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("natrix: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Rust ignores SIGPIPE, which turns `natrix bench | head` into a panic on
/// the next print; a command-line tool should end quietly instead.
fn restore_default_sigpipe() {
    // SAFETY: called first thing in main, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// A failure of a subcommand, with the exit status it maps to.
#[derive(Debug)]
pub enum Failure {
    /// The configuration was refused (exit 2).
    Config(String),
    /// Anything else: unreadable input, unwritable output (exit 1).
    Other(String),
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::Config(_) => 2,
            Failure::Other(_) => 1,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Config(m) | Failure::Other(m) => f.write_str(m),
        }
    }
}

/// Loads a config, printing its warnings, and builds the engine it
/// describes; refusals name the file and the key.
pub fn load_engine(path: &std::path::Path) -> Result<(natrix_control::Config, natrix_engine::Engine), Failure> {
    let cfg = natrix_control::Config::load(path).map_err(|e| Failure::Config(format!("{}: {e}", path.display())))?;
    for w in &cfg.warnings {
        eprintln!("natrix: warning: {}: {w}", path.display());
    }
    let engine = natrix_engine::Engine::new(cfg.engine.clone()).map_err(|e| Failure::Config(format!("{}: nat.static: {e}", path.display())))?;
    Ok((cfg, engine))
}
