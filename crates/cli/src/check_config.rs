//! `natrix check-config FILE`.

use std::path::Path;

use crate::{load_config, Failure};

pub fn run(path: &Path) -> Result<(), Failure> {
    let cfg = load_config(path)?;
    natrix_engine::Engine::new(cfg.engine.clone()).map_err(|e| Failure::Config(format!("{}: nat.static: {e}", path.display())))?;
    let e = &cfg.engine;
    println!(
        "{}: valid ({} pool addresses, ports {}-{}, {} filtering, up to {} ports per subscriber)",
        path.display(),
        e.pool.len(),
        e.ports.0,
        e.ports.1,
        match e.filtering {
            natrix_engine::config::Filtering::EndpointIndependent => "endpoint-independent",
            natrix_engine::config::Filtering::AddressDependent => "address-dependent",
            natrix_engine::config::Filtering::AddressAndPortDependent => "address-and-port-dependent",
        },
        e.max_ports_per_subscriber
    );
    Ok(())
}
