//! `natrix check-config FILE`.

use std::path::Path;

use crate::{load_engine, Failure};

pub fn run(path: &Path) -> Result<(), Failure> {
    let (cfg, _) = load_engine(path)?;
    let e = &cfg.engine;
    println!(
        "{}: valid ({} pool addresses, ports {}-{}, {} filtering, up to {} ports per subscriber)",
        path.display(),
        e.pool.len(),
        e.ports.0,
        e.ports.1,
        e.filtering.name(),
        e.max_ports_per_subscriber
    );
    Ok(())
}
