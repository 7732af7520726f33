//! natrix's control plane: the operator's TOML configuration (parsed and
//! validated into the engine's typed config), the replay report, and the
//! NAT event log. Nothing here is on the per-packet path.

pub mod api;
pub mod cluster;
pub mod config;
pub mod duration;
pub mod eventlog;
pub mod host_id_metrics;
pub mod ipfix;
pub mod metrics;
pub mod report;
pub mod sinks;
pub mod synaccel_metrics;
pub mod syslog;

pub use config::{Config, ConfigError, IoBackend, LiveConfig, LogUnit, LoggingConfig, Offload, PreferBusyPoll, XdpProgramMode};
