//! The `natrix` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod bench;
mod check_config;
mod gen;
mod generate;
mod lab;
mod pcp;
mod replay;
mod run;
mod show;
mod tester;
mod whois;

/// `natrix --version`: the crate version and the commit it was built from
/// (build.rs; "unknown" outside a git checkout).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("NATRIX_COMMIT"), ")");

#[derive(Parser)]
#[command(name = "natrix", version = VERSION, about = "natrix: a software carrier-grade NAT (NAPT44)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a configuration file: exit 0 if valid, else name the key and the problem.
    CheckConfig(check_config::Args),
    /// Run the engine over a capture (pcap or pcapng) and write the translated frames as pcapng.
    Replay(replay::Args),
    /// Measure the engine's speed and memory on generated 64-byte frames (new and established flows).
    Bench(bench::Args),
    /// A lab of network namespaces on this machine: `up`, `down`, or (default) a demo with real traffic through natrix.
    Lab(lab::Args),
    /// Run the NAT live on the configured interfaces, in the foreground.
    Run(run::Args),
    /// Generate test traffic on an interface or into a capture (or receive and check it): constant rate, RFC 4814 ports, SYN floods.
    Gen(gen::Args),
    /// Measure a NAT in the lab (natrix or the kernel's) by RFC 9693, RFC 2544 and RFC 8219, and seed 002's method.
    Test(tester::Args),
    /// Show a running natrix's sessions, mappings or statistics.
    Show(show::ShowArgs),
    /// Remove a subscriber's sessions and mappings from a running natrix.
    Clear(show::ClearArgs),
    /// Who held an external address and port at a given time: from the event log or a deterministic config.
    Whois(whois::Args),
    /// A PCP (RFC 6887) client: ask a PCP server for a MAP or PEER mapping, or for an ANNOUNCE.
    Pcp(pcp::Args),
    /// Write the manual pages: natrix.1 to stdout, or natrix.1 and one page per command into --out DIR.
    #[command(hide = true)]
    Man {
        /// The directory to write the pages into.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Print the completion script for a shell (bash, zsh, fish, elvish, powershell).
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
}

fn main() -> ExitCode {
    restore_default_sigpipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::CheckConfig(args) => check_config::run(&args),
        Command::Replay(args) => replay::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Lab(args) => lab::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Gen(args) => gen::run(&args),
        Command::Test(args) => tester::run(&args),
        Command::Show(args) => show::show(&args),
        Command::Clear(args) => show::clear(&args),
        Command::Whois(args) => whois::run(&args),
        Command::Pcp(args) => pcp::run(&args),
        Command::Man { out } => generate::man(Cli::command(), out.as_deref()),
        Command::Completions { shell } => generate::completions(Cli::command(), shell),
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
    /// The command was used wrongly or its input cannot be used: a bad
    /// argument, a missing file, an output that would overwrite an input (exit 2).
    Usage(String),
    /// Anything else: unreadable input, unwritable output (exit 1).
    Other(String),
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::Config(_) | Failure::Usage(_) => 2,
            Failure::Other(_) => 1,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Config(m) | Failure::Usage(m) | Failure::Other(m) => f.write_str(m),
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
    let engine = natrix_engine::Engine::new(cfg.engine.clone()).map_err(|e| engine_failure(path, &e))?;
    Ok((cfg, engine))
}

/// An engine that cannot be built: a configuration that cannot be put in
/// force (exit 2) or memory the host cannot give (exit 1).
pub fn engine_failure(path: &std::path::Path, e: &natrix_engine::EngineError) -> Failure {
    match e {
        natrix_engine::EngineError::Config { .. } | natrix_engine::EngineError::NeedsRestart { .. } => Failure::Config(format!("{}: {e}", path.display())),
        natrix_engine::EngineError::Memory { .. } => Failure::Other(format!("{}: {e}", path.display())),
    }
}
