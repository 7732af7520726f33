//! An engine whose tables the host cannot give is refused with an error that
//! names the key to change, never aborted. Its own test binary: it caps the
//! whole process's address space, which no other test should run under.

mod common;

use common::config;
use natrix_engine::{Engine, EngineConfig, EngineError};

#[test]
fn a_table_the_host_cannot_give_is_refused_not_aborted() {
    let cap = libc::rlimit { rlim_cur: 2 << 30, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit with a valid struct; lowering the soft limit only.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &cap) }, 0);
    // The largest table the configuration accepts: 8 GiB of records alone.
    let cfg = EngineConfig { max_sessions: 1 << 28, ..config() };
    match Engine::new(cfg) {
        Err(e @ EngineError::Memory { .. }) => {
            let text = e.to_string();
            assert!(text.contains("max_sessions") && text.contains("GiB"), "{text}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("an engine for 2^28 sessions was built under a 2 GiB address-space limit"),
    }
}
