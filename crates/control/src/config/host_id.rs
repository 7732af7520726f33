//! `[host_id]` and `[[host_id.rule]]`: HOST_ID TCP options (seed 000), with
//! the keys and defaults of CONTRACTS.md ("HOST_ID TCP options"). Works in
//! every `[nat] mode`, "off" included (the policy in front of servers).

use natrix_engine::host_id::{Action, HostIdConfig, Kinds, Mode, Origin, Rule, RuleOption, WingData};

use natrix_engine::config::EngineConfig;

use super::{err, ConfigError, Section};

pub(super) fn parse(root: &mut Section, warnings: &mut Vec<String>) -> Result<Option<HostIdConfig>, ConfigError> {
    let Some(mut s) = root.section("host_id")? else { return Ok(None) };
    let mode = s.choice("mode", &[("off", Mode::Off), ("syn", Mode::Syn), ("ack", Mode::Ack)])?.unwrap_or(Mode::Off);
    let wing_on = s.boolean("wing")?.unwrap_or(false);
    let wing_data = s.choice("wing_data", &[("ipv4-low16", WingData::Ipv4Low16), ("port", WingData::Port)])?.unwrap_or(WingData::Ipv4Low16);
    let boucadair = parse_boucadair(&mut s)?;
    let lifetime = s.integer("lifetime", 0, u32::from(HostIdConfig::MAX_LIFETIME))?.unwrap_or(0) as u8;
    let enabled = s.boolean("enabled")?.unwrap_or(false);
    let kinds = parse_kinds(&mut s, warnings)?;
    let rules = parse_rules(&mut s)?;
    s.finish()?;
    if mode == Mode::Ack && boucadair.is_none() {
        return err("host_id.boucadair", "mode = \"ack\" carries HOST_ID_BOUCADAIR in the first ACK: choose its origin (\"port\", \"ipv4\", \"port-ipv4\" or \"ipv6-prefix\")");
    }
    if mode == Mode::Off && (wing_on || boucadair.is_some() || enabled) {
        warnings.push("host_id.mode: \"off\" writes no option: wing, boucadair and enabled take effect with mode = \"syn\" or \"ack\"".to_owned());
    }
    let cfg = HostIdConfig { mode, wing: wing_on.then_some(wing_data), boucadair, lifetime, enabled, kinds, rules };
    Ok(cfg.is_active().then_some(cfg))
}

/// Origin 3 carries a softwire B4's first 56 bits: without `[dslite]` no
/// subscriber has one, so nothing would ever be written.
pub(super) fn check_origin_needs_dslite(engine: &EngineConfig) -> Result<(), ConfigError> {
    let origin3 = engine.host_id.as_ref().is_some_and(|h| h.boucadair == Some(Origin::Ipv6Prefix));
    if origin3 && engine.dslite.is_none() {
        return err(
            "host_id.boucadair",
            "\"ipv6-prefix\" (origin 3) carries a DS-Lite B4's first 56 bits and needs [dslite] (aftr = ...): without softwires no subscriber has a B4; use \"port\", \"ipv4\" or \"port-ipv4\"",
        );
    }
    Ok(())
}

/// "off", or the origin of seed 000 section 3.2 by name.
fn parse_boucadair(s: &mut Section) -> Result<Option<Origin>, ConfigError> {
    s.parsed("boucadair", |t| match t {
        "off" => Ok(None),
        "port" => Ok(Some(Origin::Port)),
        "ipv4" => Ok(Some(Origin::Ipv4)),
        "port-ipv4" => Ok(Some(Origin::PortIpv4)),
        "ipv6-prefix" => Ok(Some(Origin::Ipv6Prefix)),
        _ => Err(format!("\"{t}\" is not one of \"off\", \"port\", \"ipv4\", \"port-ipv4\", \"ipv6-prefix\"")),
    })
    .map(Option::flatten)
}

/// `kinds = { wing = 200, boucadair = 201, enabled = 202 }`: any kind but
/// EOL (0) and NOP (1), each option its own; the shared experimental
/// kinds with a warning.
fn parse_kinds(s: &mut Section, warnings: &mut Vec<String>) -> Result<Kinds, ConfigError> {
    let mut k = Kinds::DEFAULT;
    let Some(mut t) = s.section("kinds")? else { return Ok(k) };
    k.wing = t.integer("wing", 2, 255)?.map_or(k.wing, |v| v as u8);
    k.boucadair = t.integer("boucadair", 2, 255)?.map_or(k.boucadair, |v| v as u8);
    k.enabled = t.integer("enabled", 2, 255)?.map_or(k.enabled, |v| v as u8);
    t.finish()?;
    let named = [("wing", k.wing), ("boucadair", k.boucadair), ("enabled", k.enabled)];
    for (i, (name, kind)) in named.iter().enumerate() {
        if let Some((other, _)) = named[..i].iter().find(|(_, o)| o == kind) {
            return err(format!("host_id.kinds.{name}"), format!("kind {kind} is already {other}'s: each option needs its own kind"));
        }
        if let Some(known) = well_known_kind(*kind) {
            return err(format!("host_id.kinds.{name}"), format!("kind {kind} is {known} (IANA): pick an unassigned kind"));
        }
        if matches!(kind, 253 | 254) {
            warnings.push(format!(
                "host_id.kinds.{name}: kind {kind} is shared by experiments that start their data with an experiment ID (RFC 6994), which HOST_ID options do not carry: a server may read the value as another experiment's (Linux reads kind 254 starting 0xF989 as TCP Fast Open), and natrix takes other experiments' options of that kind for HOST_ID"
            ));
        }
    }
    Ok(k)
}

/// TCP option kinds hosts send every day: reusing one would rewrite or
/// strip real options.
fn well_known_kind(kind: u8) -> Option<&'static str> {
    Some(match kind {
        2 => "MSS",
        3 => "Window Scale",
        4 => "SACK Permitted",
        5 => "SACK",
        8 => "Timestamps",
        19 => "TCP MD5",
        28 => "User Timeout",
        29 => "TCP-AO",
        30 => "MPTCP",
        34 => "TCP Fast Open",
        _ => return None,
    })
}

fn parse_rules(s: &mut Section) -> Result<Vec<Rule>, ConfigError> {
    let mut rules = Vec::new();
    for (i, v) in s.array("rule")?.into_iter().flatten().enumerate() {
        let key = format!("host_id.rule[{i}]");
        let Some(t) = v.as_table() else { return err(key, "expected a table: [[host_id.rule]] with option and action") };
        let mut r = Section::new(&key, t);
        let option = r.choice("option", &[("wing", RuleOption::Wing), ("boucadair", RuleOption::Boucadair), ("enabled", RuleOption::Enabled), ("any", RuleOption::Any)])?;
        let action = r.choice("action", &[("accept", Action::Accept), ("log", Action::Log), ("drop", Action::Drop), ("strip", Action::Strip)])?;
        let value = r.parsed("value", parse_range)?;
        r.finish()?;
        let (Some(option), Some(action)) = (option, action) else {
            return err(key, "needs option (\"wing\", \"boucadair\", \"enabled\" or \"any\") and action (\"accept\", \"log\", \"drop\" or \"strip\")");
        };
        if let Some((_, hi)) = value {
            let max = match option {
                RuleOption::Wing => u64::from(u16::MAX),
                RuleOption::Boucadair => u64::MAX,
                RuleOption::Enabled | RuleOption::Any => {
                    return err(
                        format!("{key}.value"),
                        format!("option = \"{}\" has no value to compare: values are WING's 2 data bytes or BOUCADAIR's 8 bytes after the length", option.name()),
                    );
                }
            };
            if hi > max {
                return err(format!("{key}.value"), format!("{hi} is beyond {max:#x}, the largest value of HOST_ID_{}", option.name().to_uppercase()));
            }
        }
        rules.push(Rule { option, value, action });
    }
    Ok(rules)
}

/// A number or an inclusive range "a-b", each decimal or "0x" hex.
fn parse_range(t: &str) -> Result<(u64, u64), String> {
    let number = |n: &str| {
        let n = n.trim();
        match n.strip_prefix("0x").or_else(|| n.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => n.parse::<u64>(),
        }
        .map_err(|_| format!("\"{t}\": \"{n}\" is not a number (decimal, or hex with 0x), e.g. \"1000-2000\" or \"0x0a00-0x0aff\""))
    };
    let (lo, hi) = match t.split_once('-') {
        Some((a, b)) => (number(a)?, number(b)?),
        None => {
            let v = number(t)?;
            (v, v)
        }
    };
    if lo > hi {
        return Err(format!("\"{t}\": the range's start is above its end"));
    }
    Ok((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const BASE: &str = "[nat]\npool = [\"203.0.113.0/28\"]\n";

    fn host_id(extra: &str) -> Option<HostIdConfig> {
        Config::parse(&format!("{BASE}[host_id]\n{extra}")).unwrap().engine.host_id
    }

    fn problem(extra: &str) -> String {
        Config::parse(&format!("{BASE}[host_id]\n{extra}")).unwrap_err().to_string()
    }

    #[test]
    fn the_contract_keys_and_defaults() {
        assert_eq!(host_id(""), None, "mode off without rules does nothing");
        let h = host_id("mode = \"syn\"\nwing = true\nboucadair = \"port-ipv4\"\nlifetime = 3\nenabled = true\n").unwrap();
        assert_eq!(h.mode, Mode::Syn);
        assert_eq!(h.wing, Some(WingData::Ipv4Low16));
        assert_eq!((h.boucadair, h.lifetime, h.enabled), (Some(Origin::PortIpv4), 3, true));
        assert_eq!(h.kinds, Kinds { wing: 200, boucadair: 201, enabled: 202 });
        let k = host_id("mode = \"syn\"\nwing = true\nwing_data = \"port\"\nkinds = { wing = 253, boucadair = 254, enabled = 250 }\n").unwrap();
        assert_eq!((k.wing, k.kinds), (Some(WingData::Port), Kinds { wing: 253, boucadair: 254, enabled: 250 }));
        let warned = Config::parse(&format!("{BASE}[host_id]\nmode = \"syn\"\nwing = true\nkinds = {{ wing = 254 }}\n")).unwrap().warnings;
        assert!(warned.iter().any(|w| w.starts_with("host_id.kinds.wing: kind 254 is shared by experiments")), "{warned:?}");
    }

    #[test]
    fn rules_take_values_and_ranges_in_decimal_and_hex() {
        let h = host_id(
            "[[host_id.rule]]\noption = \"wing\"\nvalue = \"1000-2000\"\naction = \"drop\"\n\
             [[host_id.rule]]\noption = \"boucadair\"\nvalue = \"0x0164400000000000-0x01644000ffffffff\"\naction = \"log\"\n\
             [[host_id.rule]]\noption = \"any\"\naction = \"strip\"\n",
        )
        .unwrap();
        assert_eq!(h.mode, Mode::Off);
        assert_eq!(
            h.rules,
            [
                Rule { option: RuleOption::Wing, value: Some((1000, 2000)), action: Action::Drop },
                Rule { option: RuleOption::Boucadair, value: Some((0x0164_4000_0000_0000, 0x0164_4000_ffff_ffff)), action: Action::Log },
                Rule { option: RuleOption::Any, value: None, action: Action::Strip },
            ]
        );
        let one = host_id("[[host_id.rule]]\noption = \"wing\"\nvalue = \"0x0a\"\naction = \"accept\"\n").unwrap();
        assert_eq!(one.rules[0].value, Some((10, 10)));
    }

    #[test]
    fn bad_values_name_the_key_and_the_value() {
        assert!(problem("mode = \"on\"\n").starts_with("host_id.mode: \"on\" is not one of \"off\", \"syn\", \"ack\""));
        assert!(problem("mode = \"ack\"\n").starts_with("host_id.boucadair: mode = \"ack\" carries HOST_ID_BOUCADAIR"));
        assert!(problem("boucadair = \"ipv6\"\n").starts_with("host_id.boucadair: \"ipv6\" is not one of"));
        assert!(problem("mode = \"syn\"\nboucadair = \"ipv6-prefix\"\n")
            .starts_with("host_id.boucadair: \"ipv6-prefix\" (origin 3) carries a DS-Lite B4's first 56 bits and needs [dslite]"));
        assert!(problem("wing_data = \"ipv4\"\n").starts_with("host_id.wing_data: \"ipv4\" is not one of \"ipv4-low16\", \"port\""));
        assert!(problem("lifetime = 16\n").starts_with("host_id.lifetime: 16 is out of range 0-15"));
        assert!(problem("kinds = { wing = 1 }\n").starts_with("host_id.kinds.wing: 1 is out of range 2-255"));
        assert!(problem("kinds = { wing = 201 }\n").starts_with("host_id.kinds.boucadair: kind 201 is already wing's"));
        assert!(problem("kinds = { enabled = 8 }\n").starts_with("host_id.kinds.enabled: kind 8 is Timestamps"));
        assert!(problem("kinds = { wings = 210 }\n").starts_with("host_id.kinds.wings: unknown key; did you mean `wing`?"));
        assert!(problem("[[host_id.rule]]\noption = \"wing\"\nvalue = \"2000-1000\"\naction = \"drop\"\n")
            .starts_with("host_id.rule[0].value: \"2000-1000\": the range's start is above its end"));
        assert!(problem("[[host_id.rule]]\noption = \"wing\"\nvalue = \"70000\"\naction = \"drop\"\n").starts_with("host_id.rule[0].value: 70000 is beyond 0xffff"));
        assert!(problem("[[host_id.rule]]\noption = \"wing\"\nvalue = \"12z\"\naction = \"drop\"\n").starts_with("host_id.rule[0].value: \"12z\": \"12z\" is not a number"));
        assert!(problem("[[host_id.rule]]\noption = \"enabled\"\nvalue = \"1\"\naction = \"drop\"\n").starts_with("host_id.rule[0].value: option = \"enabled\" has no value"));
        assert!(problem("[[host_id.rule]]\noption = \"wing\"\naction = \"reject\"\n")
            .starts_with("host_id.rule[0].action: \"reject\" is not one of \"accept\", \"log\", \"drop\", \"strip\""));
        assert!(problem("[[host_id.rule]]\noption = \"wing\"\n").starts_with("host_id.rule[0]: needs option"));
        assert!(problem("[[host_id.rule]]\noption = \"wing\"\naction = \"drop\"\nvalues = \"1\"\n").starts_with("host_id.rule[0].values: unknown key; did you mean `value`?"));
        assert!(problem("mod = \"syn\"\n").starts_with("host_id.mod: unknown key; did you mean `mode`?"));
    }

    #[test]
    fn origin_3_is_taken_with_dslite() {
        let c = Config::parse(&format!("{BASE}[dslite]\naftr = \"2001:db8:0:1::1\"\n[host_id]\nmode = \"syn\"\nboucadair = \"ipv6-prefix\"\n")).unwrap();
        assert_eq!(c.engine.host_id.unwrap().boucadair, Some(Origin::Ipv6Prefix));
    }

    #[test]
    fn router_mode_takes_the_policy() {
        let c = Config::parse("[nat]\nmode = \"off\"\n[[host_id.rule]]\noption = \"any\"\naction = \"strip\"\n").unwrap();
        assert!(!c.engine.translate && c.engine.host_id.is_some());
    }

    #[test]
    fn options_without_a_mode_are_accepted_with_a_warning() {
        let c = Config::parse(&format!("{BASE}[host_id]\nwing = true\n")).unwrap();
        assert!(c.warnings.iter().any(|w| w.starts_with("host_id.mode:")), "{:?}", c.warnings);
    }
}
