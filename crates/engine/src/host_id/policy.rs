//! Server-side policy (seed 000 section 8): `[[host_id.rule]]`s, first
//! match wins, no match accepts. A rule names an option (or any), an
//! optional value or inclusive range, and what to do: accept, log, drop
//! (seed 000 section 8.5) or strip (NOPs over the option, section 8.3).

use super::options::{value_of, Present, Scan, Which};

/// Which options a rule looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleOption {
    Wing,
    Boucadair,
    Enabled,
    /// Any HOST_ID option.
    Any,
}

impl RuleOption {
    /// Whether the rule's option names HOST_ID option `w`.
    pub fn covers(self, w: Which) -> bool {
        match self {
            RuleOption::Wing => w == Which::Wing,
            RuleOption::Boucadair => w == Which::Boucadair,
            RuleOption::Enabled => w == Which::Enabled,
            RuleOption::Any => true,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            RuleOption::Wing => "wing",
            RuleOption::Boucadair => "boucadair",
            RuleOption::Enabled => "enabled",
            RuleOption::Any => "any",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Accept,
    /// A JSON event with the option and its value, then accept.
    Log,
    Drop,
    /// Overwrite the options the rule names with NOPs, then accept.
    Strip,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Accept => "accept",
            Action::Log => "log",
            Action::Drop => "drop",
            Action::Strip => "strip",
        }
    }
}

/// One `[[host_id.rule]]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub option: RuleOption,
    /// Inclusive range of values (WING's 2 data bytes, BOUCADAIR's 8 bytes
    /// after the length, big-endian); None: any value, or none (ENABLED).
    pub value: Option<(u64, u64)>,
    pub action: Action,
}

impl Rule {
    /// The first option of `scan` this rule matches.
    fn matches(&self, header: &[u8], scan: &Scan) -> Option<Present> {
        scan.iter().find(|p| {
            self.option.covers(p.which)
                && match self.value {
                    None => true,
                    Some((lo, hi)) => value_of(header, p).is_some_and(|v| (lo..=hi).contains(&v)),
                }
        })
    }
}

/// The rule that decides a segment: its index and the option it matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub rule: usize,
    pub matched: Present,
}

/// The first rule that matches a segment whose TCP header is `header`.
pub fn decide(rules: &[Rule], header: &[u8], scan: &Scan) -> Option<Decision> {
    if scan.is_empty() {
        return None;
    }
    rules.iter().enumerate().find_map(|(i, r)| r.matches(header, scan).map(|matched| Decision { rule: i, matched }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_id::Kinds;

    const KINDS: Kinds = Kinds { wing: 200, boucadair: 201, enabled: 202 };

    fn header(options: &[u8]) -> Vec<u8> {
        let mut h = vec![0u8; 20];
        h.extend(options);
        h.resize(20 + options.len().next_multiple_of(4), 1);
        h[12] = ((h.len() / 4) as u8) << 4;
        h
    }

    fn rule(option: RuleOption, value: Option<(u64, u64)>, action: Action) -> Rule {
        Rule { option, value, action }
    }

    #[test]
    fn first_match_wins_and_ranges_are_inclusive() {
        let rules = [
            rule(RuleOption::Wing, Some((1000, 2000)), Action::Drop),
            rule(RuleOption::Boucadair, Some((0x0100_0000_0000_0000, 0x01ff_ffff_ffff_ffff)), Action::Log),
            rule(RuleOption::Any, None, Action::Strip),
        ];
        let at = |v: u16| {
            let [a, b] = v.to_be_bytes();
            header(&[200, 4, a, b])
        };
        for (v, expect) in [(999, Some(2)), (1000, Some(0)), (2000, Some(0)), (2001, Some(2))] {
            let h = at(v);
            assert_eq!(decide(&rules, &h, &Scan::of(&h, &KINDS)).map(|d| d.rule), expect, "WING {v}");
        }
        // BOUCADAIR origin 1 (IPv4 100.64.0.10) reads 0x0164_4000_0a00_0000: inside rule 1's range.
        let h = header(&[201, 10, 0x01, 100, 64, 0, 10, 0, 0, 0]);
        assert_eq!(decide(&rules, &h, &Scan::of(&h, &KINDS)).map(|d| d.rule), Some(1));
        let h = header(&[201, 10, 0x02, 100, 64, 0, 10, 0, 0, 0]);
        assert_eq!(decide(&rules, &h, &Scan::of(&h, &KINDS)).map(|d| d.rule), Some(2), "origin 2 is past the range");
        let h = header(&[2, 4, 5, 180]);
        assert_eq!(decide(&rules, &h, &Scan::of(&h, &KINDS)), None, "no HOST_ID option: no rule");
    }

    #[test]
    fn a_value_never_matches_an_option_of_the_wrong_length() {
        let rules = [rule(RuleOption::Wing, Some((0, 0xffff)), Action::Drop)];
        let h = header(&[200, 6, 0, 1, 2, 3]);
        assert_eq!(decide(&rules, &h, &Scan::of(&h, &KINDS)), None);
        let any = [rule(RuleOption::Wing, None, Action::Drop)];
        assert_eq!(decide(&any, &h, &Scan::of(&h, &KINDS)).map(|d| d.rule), Some(0), "without a value the option's presence matches");
    }
}
