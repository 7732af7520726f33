//! Durations as operators write them: "2h4m", "120s", "5m", "500ms", or a
//! bare integer number of seconds.

/// Parses a duration into milliseconds; the error says what is wrong.
pub fn parse_ms(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return secs.checked_mul(1000).ok_or_else(|| "duration too large".into());
    }
    let mut total: u64 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("\"{text}\" is not a duration (examples: \"2h4m\", \"120s\", \"500ms\")"));
        }
        let n: u64 = rest[..digits].parse().map_err(|_| format!("\"{text}\": number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => return Err(format!("\"{text}\": missing unit after {n} (use h, m, s or ms)")),
            u => return Err(format!("\"{text}\": unknown unit \"{u}\" (use h, m, s or ms)")),
        };
        rest = &rest[unit_len..];
        total = n.checked_mul(scale).and_then(|v| total.checked_add(v)).ok_or_else(|| format!("\"{text}\": duration too large"))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::parse_ms;

    #[test]
    fn accepts_compound_and_bare_forms() {
        assert_eq!(parse_ms("2h4m"), Ok((2 * 3600 + 4 * 60) * 1000));
        assert_eq!(parse_ms("120s"), Ok(120_000));
        assert_eq!(parse_ms("500ms"), Ok(500));
        assert_eq!(parse_ms("90"), Ok(90_000));
        assert_eq!(parse_ms("1d"), Ok(86_400_000));
    }

    #[test]
    fn refuses_garbage_with_a_reason() {
        assert!(parse_ms("").is_err());
        assert!(parse_ms("5x").unwrap_err().contains("unknown unit"));
        assert!(parse_ms("h5").unwrap_err().contains("not a duration"));
        assert!(parse_ms("5").is_ok());
        assert!(parse_ms("99999999999999999999h").is_err());
    }
}
