//! `[dslite]`: the DS-Lite AFTR (RFC 6333) with the keys of CONTRACTS.md
//! ("DS-Lite AFTR"). Setting `aftr` turns it on; softwire hosts are
//! translated by NAPT44, so the section needs translation; in
//! deterministic mode `[nat] subscribers` must number the B4s.

use std::net::Ipv6Addr;

use natrix_engine::dslite::{B4Prefix, DsliteConfig};
use natrix_engine::EngineConfig;

use super::{err, parse_ipv6, parse_prefix6, ConfigError, Section, NEEDS_TRANSLATION};

/// The IPv6 minimum MTU (RFC 8200 section 5): no softwire is narrower.
const MIN_MTU: u32 = 1280;
/// IPv6, IPv4 and TCP headers: what a segment leaves of the outer MTU.
const HEADERS: u32 = 80;

pub(super) fn parse(root: &mut Section, e: &EngineConfig, warnings: &mut Vec<String>) -> Result<Option<DsliteConfig>, ConfigError> {
    let Some(mut s) = root.section("dslite")? else { return Ok(None) };
    let aftr = s.parsed("aftr", parse_aftr)?;
    let b4_prefixes = parse_b4_prefixes(&mut s)?;
    let mtu = s.integer("mtu", MIN_MTU, u32::from(u16::MAX))?.unwrap_or(1500) as u16;
    let mss_clamp = parse_mss_clamp(&mut s, mtu, warnings)?;
    let ecn_compatibility = parse_ecn(&mut s)?;
    let any_key = s.has("b4_prefixes") || s.has("mtu") || s.has("mss_clamp") || s.has("ecn");
    s.finish()?;
    let Some(aftr) = aftr else {
        return if any_key { err("dslite.aftr", "missing: the AFTR's softwire address turns DS-Lite on, and the other [dslite] keys need it") } else { Ok(None) };
    };
    if !e.translate {
        return err("dslite.aftr", NEEDS_TRANSLATION);
    }
    if e.deterministic.as_ref().is_some_and(|d| !d.numbers_b4s()) {
        return err(
            "nat.subscribers",
            "deterministic mode with [dslite] numbers B4s: list their IPv6 prefixes beside any IPv4 ones, e.g. subscribers = [\"2001:db8:100::/120\"] (each B4 address one subscriber)",
        );
    }
    check_apart_from_nptv6(&b4_prefixes, e)?;
    Ok(Some(DsliteConfig { aftr, b4_prefixes, mtu, mss_clamp, ecn_compatibility }))
}

/// `ecn`: RFC 6040's encapsulation mode, "normal" (the default: the inner
/// ECN field copied to the outer header) or "compatibility" (Not-ECT outside).
fn parse_ecn(s: &mut Section) -> Result<bool, ConfigError> {
    match s.string("ecn")? {
        None | Some("normal") => Ok(false),
        Some("compatibility") => Ok(true),
        Some(other) => err("dslite.ecn", format!("\"{other}\": \"normal\" (RFC 6040's normal mode, the default) or \"compatibility\"")),
    }
}

/// NPTv6's sites and DS-Lite's B4s are kept apart, so that which function
/// serves an address is plain from the configuration: with `[[nptv6]]`
/// bindings the B4s must be listed, apart from the bindings' inside
/// prefixes (two prefixes overlap when they agree on the shorter one's bits).
fn check_apart_from_nptv6(b4_prefixes: &[B4Prefix], e: &EngineConfig) -> Result<(), ConfigError> {
    if e.nptv6.is_empty() {
        return Ok(());
    }
    if b4_prefixes.is_empty() {
        return err("dslite.b4_prefixes", "needed with [[nptv6]] bindings: list the B4 prefixes, apart from the bindings' inside prefixes");
    }
    for (i, p) in b4_prefixes.iter().enumerate() {
        if let Some((j, _)) = e.nptv6.iter().enumerate().find(|(_, b)| super::prefix6_contains(b.inside, b.prefix_len.min(p.len), p.network)) {
            return err(
                format!("dslite.b4_prefixes[{i}]"),
                format!("overlaps nptv6[{j}].inside: keep the B4s apart from NPTv6's sites (a site's hosts are NPTv6's, a B4's softwires DS-Lite's)"),
            );
        }
    }
    Ok(())
}

fn parse_aftr(t: &str) -> Result<Ipv6Addr, String> {
    let a = parse_ipv6(t)?;
    if a.is_multicast() || a.is_unspecified() || a.is_loopback() {
        return Err(format!("\"{t}\" cannot be a softwire endpoint (multicast, unspecified or loopback)"));
    }
    Ok(a)
}

fn parse_b4_prefixes(s: &mut Section) -> Result<Vec<B4Prefix>, ConfigError> {
    let mut out = Vec::new();
    for (i, v) in s.array("b4_prefixes")?.into_iter().flatten().enumerate() {
        let key = format!("dslite.b4_prefixes[{i}]");
        let Some(t) = v.as_str() else { return err(key, "expected a string like \"2001:db8:100::/40\"") };
        let (network, len) = parse_b4_prefix(t).or_else(|m| err(&key, m))?;
        out.push(B4Prefix { network, len });
    }
    Ok(out)
}

/// "ADDRESS/LENGTH" of a prefix of B4 addresses; host bits must be zero.
pub(super) fn parse_b4_prefix(t: &str) -> Result<(Ipv6Addr, u8), String> {
    let (network, len) = parse_prefix6(t)?;
    let host = u128::MAX.checked_shr(u32::from(len)).unwrap_or(0);
    if u128::from(network) & host != 0 {
        return Err(format!("\"{t}\" has host bits set; did you mean {}/{len}?", Ipv6Addr::from(u128::from(network) & !host)));
    }
    Ok((network, len))
}

/// 0: the MTU less 80 bytes of headers; a number: that; "off": no clamping.
fn parse_mss_clamp(s: &mut Section, mtu: u16, warnings: &mut Vec<String>) -> Result<Option<u16>, ConfigError> {
    let problem = "expected 0 (the MTU less 80), an MSS of 1-65495, or \"off\"";
    match s.get("mss_clamp") {
        None => Ok(Some(DsliteConfig::default_clamp(mtu))),
        Some(toml::Value::String(t)) if t == "off" => Ok(None),
        Some(toml::Value::Integer(0)) => Ok(Some(DsliteConfig::default_clamp(mtu))),
        Some(toml::Value::Integer(n)) if (1..=65_495).contains(n) => {
            if *n > i64::from(u32::from(mtu) - HEADERS) {
                warnings.push(format!("dslite.mss_clamp: {n} is above mtu - 80 ({}): full-sized segments will not fit the softwire unfragmented", u32::from(mtu) - HEADERS));
            }
            Ok(Some(*n as u16))
        }
        Some(v) => err("dslite.mss_clamp", format!("{problem}, found {v}")),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use natrix_engine::dslite::{B4Prefix, DsliteConfig};

    const BASE: &str = "[nat]\npool = [\"203.0.113.0/28\"]\n";

    fn dslite(extra: &str) -> Option<DsliteConfig> {
        Config::parse(&format!("{BASE}[dslite]\n{extra}")).unwrap().engine.dslite
    }

    fn problem(extra: &str) -> String {
        Config::parse(&format!("{BASE}[dslite]\n{extra}")).unwrap_err().to_string()
    }

    #[test]
    fn the_contract_defaults() {
        let d = dslite("aftr = \"2001:db8:0:1::1\"\n").unwrap();
        assert_eq!(d, DsliteConfig { aftr: "2001:db8:0:1::1".parse().unwrap(), b4_prefixes: vec![], mtu: 1500, mss_clamp: Some(1420), ecn_compatibility: false });
        assert_eq!(dslite(""), None, "no aftr, no DS-Lite");
        let d = dslite("aftr = \"2001:db8:0:1::1\"\nb4_prefixes = [\"2001:db8:100::/40\"]\nmtu = 1460\nmss_clamp = 0\n").unwrap();
        assert_eq!((d.mtu, d.mss_clamp), (1460, Some(1380)));
        assert_eq!(d.b4_prefixes, [B4Prefix { network: "2001:db8:100::".parse().unwrap(), len: 40 }]);
        assert_eq!(dslite("aftr = \"2001:db8:0:1::1\"\nmss_clamp = \"off\"\n").unwrap().mss_clamp, None);
        assert_eq!(dslite("aftr = \"2001:db8:0:1::1\"\nmss_clamp = 1200\n").unwrap().mss_clamp, Some(1200));
    }

    #[test]
    fn bad_values_name_the_key() {
        assert!(problem("aftr = \"2001:db8::zz\"\n").starts_with("dslite.aftr: \"2001:db8::zz\" is not an IPv6 address"));
        assert!(problem("aftr = \"ff02::1\"\n").starts_with("dslite.aftr:"));
        assert!(problem("mtu = 1400\n").starts_with("dslite.aftr: missing"));
        let with = |k: &str| problem(&format!("aftr = \"2001:db8:0:1::1\"\n{k}\n"));
        assert!(with("mtu = 1279").starts_with("dslite.mtu: 1279 is out of range 1280-65535"));
        assert!(with("mss_clamp = \"on\"").starts_with("dslite.mss_clamp: expected 0"));
        assert!(with("mss_clamp = -1").starts_with("dslite.mss_clamp: expected 0"));
        assert!(with("b4_prefixes = [\"2001:db8:100::1/40\"]").starts_with("dslite.b4_prefixes[0]: \"2001:db8:100::1/40\" has host bits set; did you mean 2001:db8:100::/40?"));
        assert!(with("b4_prefixes = [7]").starts_with("dslite.b4_prefixes[0]: expected a string"));
        assert!(with("aftr6 = 1").starts_with("dslite.aftr6: unknown key"));
    }

    #[test]
    fn modes_without_dynamic_translation_refuse_it() {
        let off = Config::parse("[nat]\nmode = \"off\"\n[dslite]\naftr = \"2001:db8:0:1::1\"\n").unwrap_err();
        assert_eq!(off.key, "dslite.aftr");
        let det = Config::parse(
            "[nat]\nmode = \"deterministic\"\npool = [\"203.0.113.0/28\"]\nsubscribers = [\"100.64.0.0/24\"]\nports_per_subscriber = 1008\n[dslite]\naftr = \"2001:db8:0:1::1\"\n",
        )
        .unwrap_err();
        assert_eq!(det.key, "nat.subscribers");
        assert!(det.problem.contains("numbers B4s"), "{}", det.problem);
    }

    #[test]
    fn deterministic_mode_numbers_b4_prefixes_only_with_dslite() {
        let det = |subs: &str, dslite: &str| {
            Config::parse(&format!("[nat]\nmode = \"deterministic\"\npool = [\"203.0.113.0/28\"]\nsubscribers = [{subs}]\nports_per_subscriber = 1008\n{dslite}"))
        };
        let on = "[dslite]\naftr = \"2001:db8:0:1::1\"\n";
        let c = det("\"2001:db8:100::/120\", \"100.64.0.0/24\"", on).unwrap();
        assert_eq!(c.engine.deterministic.unwrap().subscriber_count(), 512);
        let e = det("\"100.64.0.0/24\", \"2001:db8:100::/120\"", "").unwrap_err();
        assert_eq!((e.key.as_str(), e.problem.contains("needs [dslite]")), ("nat.subscribers[1]", true), "{e}");
        let e = det("\"2001:db8:100::/64\"", on).unwrap_err();
        assert_eq!(e.key, "nat.subscribers");
        assert!(e.problem.starts_with("18446744073709551616 subscribers do not fit"), "{e}");
        assert!(e.problem.contains("can hold 1024 subscribers"), "{e}");
        let e = det("\"2001:db8:100::1/120\"", on).unwrap_err();
        assert_eq!(e.key, "nat.subscribers[0]");
        assert!(e.problem.contains("host bits set"), "{e}");
    }

    #[test]
    fn b4s_must_be_apart_from_nptv6_sites() {
        let nptv6 = "[[nptv6]]\ninside = \"fd01:203:405::/48\"\noutside = \"2001:db8:1::/48\"\n";
        let with = |b4s: &str| Config::parse(&format!("{BASE}{nptv6}[dslite]\naftr = \"2001:db8:0:1::1\"\n{b4s}"));
        assert_eq!(with("").unwrap_err().key, "dslite.b4_prefixes");
        assert_eq!(with("b4_prefixes = [\"2001:db8:100::/40\", \"fd01:203:405:7::/64\"]\n").unwrap_err().key, "dslite.b4_prefixes[1]");
        assert!(with("b4_prefixes = [\"2001:db8:100::/40\"]\n").is_ok());
    }

    #[test]
    fn a_clamp_above_the_mtu_is_accepted_with_a_warning() {
        let c = Config::parse(&format!("{BASE}[dslite]\naftr = \"2001:db8:0:1::1\"\nmss_clamp = 1460\n")).unwrap();
        assert!(c.warnings.iter().any(|w| w.starts_with("dslite.mss_clamp:")), "{:?}", c.warnings);
    }
}
