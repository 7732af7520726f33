//! `[sctp]`: the limits of SCTP NAT (seed 001 section 7 and CONTRACTS "SCTP
//! NAT"). SCTP is translated whenever NAT is on; this section only tunes it,
//! so with `[nat] mode = "off"` every key of it is refused by name.

use natrix_engine::nat44::sctp::{ReplyOotb, SctpConfig};
use natrix_engine::EngineConfig;

use super::{refuse_without_translation, ConfigError, Section};

/// The most chunks a 1500-byte packet can hold (4 bytes each, seed 001
/// section 3.1.1) is 375; larger limits would only say "no limit".
const MAX_CHUNKS: u32 = 375;
/// Parameters are 4 bytes at least too.
const MAX_PARAMS: u32 = 375;
/// An association records how many addresses it tracks in one byte.
const MAX_TRACKED: u32 = 256;
const MAX_ASSOCIATIONS: u32 = 1 << 26;

pub(super) fn parse(root: &mut Section, e: &EngineConfig) -> Result<SctpConfig, ConfigError> {
    let mut c = SctpConfig::default();
    let Some(mut s) = root.section("sctp")? else { return Ok(c) };
    refuse_without_translation(&s, e)?;
    c.max_chunks = s.integer("max_chunks", 1, MAX_CHUNKS)?.unwrap_or(c.max_chunks);
    c.max_params = s.integer("max_params", 1, MAX_PARAMS)?.unwrap_or(c.max_params);
    c.track_global_addresses = s.integer("track_global_addresses", 0, MAX_TRACKED)?.unwrap_or(c.track_global_addresses);
    c.reply_ootb = s.choice("reply_ootb", &ReplyOotb::ALL.map(|r| (r.name(), r)))?.unwrap_or(c.reply_ootb);
    c.max_associations = s.integer("max_associations", 1, MAX_ASSOCIATIONS)?.unwrap_or(c.max_associations);
    s.finish()?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use natrix_engine::nat44::sctp::ReplyOotb;

    const BASE: &str = "[nat]\npool = [\"203.0.113.0/28\"]\n";

    #[test]
    fn defaults_are_the_seeds_and_every_key_is_read() {
        let c = Config::parse(BASE).unwrap().engine;
        assert_eq!((c.sctp.max_chunks, c.sctp.max_params, c.sctp.track_global_addresses, c.sctp.reply_ootb), (2, 25, 0, ReplyOotb::Inside));
        assert_eq!((c.timeouts.sctp_init_s, c.timeouts.sctp_s), (15, 300));
        let c = Config::parse(&format!(
            "{BASE}max_ports_per_protocol = {{ sctp = 4 }}\n[sctp]\nmax_chunks = 4\nmax_params = 10\ntrack_global_addresses = 25\nreply_ootb = \"both\"\nmax_associations = 1000\n\
             [timeouts]\nsctp_init = \"20s\"\nsctp = \"10m\"\n"
        ))
        .unwrap();
        let e = c.engine;
        assert_eq!((e.sctp.max_chunks, e.sctp.max_params, e.sctp.track_global_addresses, e.sctp.reply_ootb, e.sctp.max_associations), (4, 10, 25, ReplyOotb::Both, 1000));
        assert_eq!((e.timeouts.sctp_init_s, e.timeouts.sctp_s), (20, 600));
        assert_eq!(e.max_ports_per_protocol[natrix_engine::Proto::Sctp as usize], 4);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn bad_values_name_their_key() {
        for (bad, key) in [
            ("max_chunks = 0", "sctp.max_chunks"),
            ("max_params = 100000", "sctp.max_params"),
            ("track_global_addresses = -1", "sctp.track_global_addresses"),
            ("reply_ootb = \"outside\"", "sctp.reply_ootb"),
            ("max_chunk = 2", "sctp.max_chunk"),
        ] {
            assert_eq!(Config::parse(&format!("{BASE}[sctp]\n{bad}\n")).unwrap_err().key, key, "{bad}");
        }
        let e = Config::parse("[nat]\nmode = \"off\"\n[sctp]\nmax_chunks = 2\n").unwrap_err();
        assert_eq!(e.key, "sctp.max_chunks", "router mode translates no SCTP");
        let c = Config::parse(&format!("{BASE}[timeouts]\nsctp = \"30s\"\n")).unwrap();
        assert!(c.warnings.iter().any(|w| w.starts_with("timeouts.sctp:")), "{:?}", c.warnings);
    }
}
