//! Go's duration syntax (`time.ParseDuration`), which Linkerd's Links use for
//! `probeSpec.period` and `probeSpec.timeout`: `3s`, `1m30s`, `500ms`, `1.5s`, `1h0m0s`.
//!
//! Stricter than Go on purpose: no sign at all (a negative period or timeout means
//! nothing, and `+` is never written by Linkerd), no whitespace. As in Go, a number
//! needs a unit unless the whole text is `0`, and units are `ns`, `us`, `µs` (or `μs`),
//! `ms`, `s`, `m`, `h`.

use std::time::Duration;

/// Units and their length in nanoseconds.
const UNITS: &[(&str, u128)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60 * 1_000_000_000),
    ("h", 3_600 * 1_000_000_000),
];

/// Longer than any duration a Link may ask for; bounds the arithmetic.
const MAX_NANOS: u128 = 1_000 * 3_600 * 1_000_000_000;

/// Parses a Go duration; the error says what is wrong, for the caller to quote.
pub(crate) fn parse_go_duration(text: &str) -> Result<Duration, &'static str> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("empty duration");
    }
    if text.starts_with(['-', '+']) {
        return Err("a duration has no sign");
    }
    let mut rest = text;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(f) => {
                let n = f.bytes().take_while(u8::is_ascii_digit).count();
                f.split_at(n)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return Err("expected a number");
        }
        // As Go: the unit is the whole run up to the next number, looked up exactly.
        let unit_len = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let unit = &after[..unit_len];
        if unit.is_empty() {
            return Err("missing unit (ns, us, ms, s, m or h)");
        }
        let Some(&(_, scale)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            return Err("unknown unit (ns, us, ms, s, m or h)");
        };
        let whole: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| "number too large")?
        };
        let mut nanos = whole.checked_mul(scale).ok_or("number too large")?;
        // Fractions beyond nanosecond precision are dropped, as Go does.
        let mut place = scale;
        for digit in frac.bytes() {
            place /= 10;
            nanos += u128::from(digit - b'0') * place;
        }
        total = total.checked_add(nanos).ok_or("number too large")?;
        if total > MAX_NANOS {
            return Err("number too large");
        }
        rest = &after[unit_len..];
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| "number too large")?;
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn go_durations_parse_to_their_value() {
        let table: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("3s", ms(3_000)),
            ("30s", ms(30_000)),
            ("1m30s", ms(90_000)),
            ("1h", ms(3_600_000)),
            ("1h0m0s", ms(3_600_000)),
            ("500ms", ms(500)),
            ("1.5s", ms(1_500)),
            (".5s", ms(500)),
            ("1.s", ms(1_000)),
            ("2h45m", ms((2 * 60 + 45) * 60_000)),
            ("1s500ms", ms(1_500)),
            ("100us", Duration::from_micros(100)),
            ("100µs", Duration::from_micros(100)),
            ("100μs", Duration::from_micros(100)),
            ("7ns", Duration::from_nanos(7)),
            ("1.0000000009s", Duration::from_secs(1)),
            ("003s", ms(3_000)),
        ];
        for (text, want) in table {
            assert_eq!(parse_go_duration(text), Ok(*want), "{text:?}");
        }
    }

    #[test]
    fn anything_but_go_syntax_is_refused() {
        let table: &[(&str, &str)] = &[
            ("", "empty duration"),
            ("3", "missing unit (ns, us, ms, s, m or h)"),
            ("30", "missing unit (ns, us, ms, s, m or h)"),
            ("1m30", "missing unit (ns, us, ms, s, m or h)"),
            ("-3s", "a duration has no sign"),
            ("+3s", "a duration has no sign"),
            ("3 s", "unknown unit (ns, us, ms, s, m or h)"),
            (" 3s", "expected a number"),
            ("3s ", "unknown unit (ns, us, ms, s, m or h)"),
            ("3d", "unknown unit (ns, us, ms, s, m or h)"),
            ("3sec", "unknown unit (ns, us, ms, s, m or h)"),
            ("3S", "unknown unit (ns, us, ms, s, m or h)"),
            ("s", "expected a number"),
            (".s", "expected a number"),
            ("1..5s", "missing unit (ns, us, ms, s, m or h)"),
            ("5mins", "unknown unit (ns, us, ms, s, m or h)"),
            ("1,5s", "unknown unit (ns, us, ms, s, m or h)"),
            ("3s-1s", "unknown unit (ns, us, ms, s, m or h)"),
            ("abc", "expected a number"),
            (
                "99999999999999999999999999999999999999999h",
                "number too large",
            ),
            ("2000h", "number too large"),
        ];
        for (text, want) in table {
            assert_eq!(parse_go_duration(text), Err(*want), "{text:?}");
        }
    }
}
