//! Parsing of the quantities operators write: sizes (`64k`, `4KiB`), durations
//! (`60s`, `100ms`, `2m`) and rates (`800KB/s`, `10MiB/s`, `500iops`, `25%`).
//!
//! Conventions, chosen to match what fio and storage people write:
//! - `KB`, `MB`, `GB` are SI (10^3, 10^6, 10^9); `KiB`, `MiB`, `GiB` are binary.
//! - A bare `k`, `m`, `g` suffix (as in fio's `bs=64k`) is binary.
//! - A rate is one of: bytes per second (`.../s`), I/Os per second (`...iops`),
//!   or a share of the device's cost capacity (`...%`, or `...cost`).
//!
//! Hand-written because no maintained crate accepts exactly fio's spelling of
//! sizes together with the SI/IEC distinction and rejects ambiguity with a message.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// What went wrong when parsing a quantity. The caller adds the field name and place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnitError(pub String);

fn split_number(text: &str) -> Result<(f64, String), UnitError> {
    let trimmed = text.trim();
    let end = trimmed
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+')))
        .map(|(i, _)| i)
        .unwrap_or(trimmed.len());
    let (num, rest) = trimmed.split_at(end);
    if num.is_empty() {
        return Err(UnitError(format!("`{text}` does not start with a number")));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| UnitError(format!("`{num}` in `{text}` is not a number")))?;
    if !value.is_finite() {
        return Err(UnitError(format!("`{text}` is not a finite number")));
    }
    Ok((value, rest.trim().to_string()))
}

fn byte_multiplier(suffix: &str) -> Option<f64> {
    let m = match suffix {
        "" | "b" | "B" => 1.0,
        "k" | "K" | "KiB" | "kiB" => 1024.0,
        "m" | "M" | "MiB" => 1024.0 * 1024.0,
        "g" | "G" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        "t" | "T" | "TiB" => 1024.0_f64.powi(4),
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return None,
    };
    Some(m)
}

/// Parses a size in bytes: `4096`, `4k`, `64KiB`, `1MB`, `10 GiB`.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let (value, suffix) = split_number(text)?;
    let mult = byte_multiplier(&suffix).ok_or_else(|| {
        UnitError(format!(
            "unknown size unit `{suffix}` in `{text}` (use B, k, KiB, KB, MiB, MB, GiB, GB)"
        ))
    })?;
    let bytes = value * mult;
    if bytes < 1.0 {
        return Err(UnitError(format!("size `{text}` must be at least 1 byte")));
    }
    if bytes >= u64::MAX as f64 {
        return Err(UnitError(format!("size `{text}` is too large")));
    }
    Ok(bytes.round() as u64)
}

/// Parses a duration: `60s`, `100ms`, `2m`, `1h`, `500us`; a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let (value, suffix) = split_number(text)?;
    let secs = match suffix.as_str() {
        "" | "s" | "sec" => value,
        "ms" => value / 1e3,
        "us" | "µs" => value / 1e6,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(UnitError(format!(
                "unknown time unit `{suffix}` in `{text}` (use us, ms, s, m, h)"
            )))
        }
    };
    if secs < 0.0 {
        return Err(UnitError(format!("duration `{text}` is negative")));
    }
    Duration::try_from_secs_f64(secs)
        .map_err(|_| UnitError(format!("duration `{text}` is too long")))
}

/// A throughput: what a floor, a ceiling or a job's rate is stated in.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "unit", content = "value", rename_all = "snake_case")]
pub enum Rate {
    /// I/O operations per second.
    Iops(f64),
    /// Bytes per second.
    BytesPerSec(f64),
    /// Cost units per second: 1.0 is the whole device busy (see `cost`).
    Cost(f64),
}

/// The unit a rate is expressed in, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RateUnit {
    Iops,
    BytesPerSec,
    Cost,
}

impl RateUnit {
    pub fn label(self) -> &'static str {
        match self {
            RateUnit::Iops => "IOPS",
            RateUnit::BytesPerSec => "B/s",
            RateUnit::Cost => "cost/s",
        }
    }
}

impl Rate {
    pub fn value(self) -> f64 {
        match self {
            Rate::Iops(v) | Rate::BytesPerSec(v) | Rate::Cost(v) => v,
        }
    }

    pub fn unit(self) -> RateUnit {
        match self {
            Rate::Iops(_) => RateUnit::Iops,
            Rate::BytesPerSec(_) => RateUnit::BytesPerSec,
            Rate::Cost(_) => RateUnit::Cost,
        }
    }

    /// Another rate in the same unit.
    pub fn with_value(self, value: f64) -> Rate {
        match self {
            Rate::Iops(_) => Rate::Iops(value),
            Rate::BytesPerSec(_) => Rate::BytesPerSec(value),
            Rate::Cost(_) => Rate::Cost(value),
        }
    }

    /// Parses `800KB/s`, `10MiB/s`, `10 MB/s`, `500iops`, `2k iops`, `25%`, `0.25cost`.
    /// Zero and negative rates are refused: a floor or rate of zero means "leave it out".
    pub fn parse(text: &str) -> Result<Rate, UnitError> {
        let lower = text.trim().to_ascii_lowercase();
        let rate = if let Some(number) = lower.strip_suffix("iops") {
            let (v, suffix) = split_number(number)?;
            let mult = match suffix.as_str() {
                "" => 1.0,
                "k" => 1e3,
                "m" => 1e6,
                _ => {
                    return Err(UnitError(format!(
                        "unknown IOPS multiplier `{suffix}` in `{text}` (use k or m)"
                    )))
                }
            };
            Rate::Iops(v * mult)
        } else if let Some(number) = text.trim().strip_suffix('%') {
            let (v, suffix) = split_number(number)?;
            if !suffix.is_empty() {
                return Err(UnitError(format!("`{text}` is not a percentage")));
            }
            Rate::Cost(v / 100.0)
        } else if let Some(number) = lower.strip_suffix("cost") {
            let (v, suffix) = split_number(number)?;
            if !suffix.is_empty() {
                return Err(UnitError(format!("`{text}` is not a cost rate")));
            }
            Rate::Cost(v)
        } else if let Some(number) = text.trim().strip_suffix("/s") {
            let (v, suffix) = split_number(number)?;
            let mult = byte_multiplier(&suffix).ok_or_else(|| {
                UnitError(format!(
                    "unknown bandwidth unit `{suffix}/s` in `{text}` (use B/s, KB/s, KiB/s, MB/s, MiB/s, GB/s, GiB/s)"
                ))
            })?;
            Rate::BytesPerSec(v * mult)
        } else {
            return Err(UnitError(format!(
                "`{text}` has no rate unit: write e.g. `10MiB/s`, `800KB/s`, `500iops` or `25%`"
            )));
        };
        if rate.value() <= 0.0 {
            return Err(UnitError(format!(
                "rate `{text}` must be greater than zero"
            )));
        }
        if !rate.value().is_finite() {
            return Err(UnitError(format!("rate `{text}` is too large")));
        }
        Ok(rate)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Rate::Iops(v) => write!(f, "{v:.0} IOPS"),
            Rate::BytesPerSec(v) => write!(f, "{}/s", format_bytes(v)),
            Rate::Cost(v) => write!(f, "{:.1}%", v * 100.0),
        }
    }
}

/// Formats bytes with binary units: `64.0 KiB`, `1.5 MiB`.
pub fn format_bytes(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut i = 0;
    while v.abs() >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_fio_and_si_iec() {
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("64KB").unwrap(), 64000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1 MiB").unwrap(), 1 << 20);
        assert!(parse_size("12 furlongs")
            .unwrap_err()
            .0
            .contains("furlongs"));
        assert!(parse_size("k").is_err());
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn rates_accept_both_mb_spellings() {
        assert_eq!(Rate::parse("10 MB/s").unwrap(), Rate::BytesPerSec(10e6));
        assert_eq!(
            Rate::parse("10MiB/s").unwrap(),
            Rate::BytesPerSec(10.0 * 1048576.0)
        );
        assert_eq!(Rate::parse("800KB/s").unwrap(), Rate::BytesPerSec(800e3));
        assert_eq!(Rate::parse("500iops").unwrap(), Rate::Iops(500.0));
        assert_eq!(Rate::parse("2k IOPS").unwrap(), Rate::Iops(2000.0));
        assert_eq!(Rate::parse("25%").unwrap(), Rate::Cost(0.25));
        assert!(Rate::parse("0iops")
            .unwrap_err()
            .0
            .contains("greater than zero"));
        assert!(Rate::parse("-5MB/s").is_err());
        assert!(Rate::parse("10MB").unwrap_err().0.contains("no rate unit"));
        assert!(Rate::parse("10 furlongs/s")
            .unwrap_err()
            .0
            .contains("furlongs"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("5").unwrap(), Duration::from_secs(5));
        assert!(parse_duration("5 fortnights").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    /// Found by fuzzing: a number too large for a Duration panicked, and one
    /// too large for an f64 once multiplied became an infinite rate.
    #[test]
    fn quantities_too_large_are_errors() {
        let huge = "9".repeat(300);
        assert!(parse_duration(&format!("{huge}h"))
            .unwrap_err()
            .0
            .contains("too long"));
        assert!(parse_duration(&"8".repeat(30)).is_err());
        let big = format!("1{}", "0".repeat(305));
        assert!(Rate::parse(&format!("{big}m iops"))
            .unwrap_err()
            .0
            .contains("too large"));
        assert!(parse_size(&format!("{big}TiB"))
            .unwrap_err()
            .0
            .contains("too large"));
    }
}

/// Quantities for config and scenario files: they accept a TOML string or
/// number and parse themselves while deserialising, so a bad value is
/// reported by the TOML parser with its file, line and key.
pub mod quantity {
    use super::Rate;
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    /// Accepts a TOML string or number as the text of a quantity.
    struct QuantityText(&'static str);

    impl serde::de::Visitor<'_> for QuantityText {
        type Value = String;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(
                f,
                "a {} such as `64k`, `500 IOPS`, `20MiB/s` or `1s`",
                self.0
            )
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }

    macro_rules! quantity {
        ($name:ident, $inner:ty, $parse:expr, $what:literal) => {
            #[derive(Debug, Clone, Copy, PartialEq)]
            pub struct $name(pub $inner);
            impl<'de> Deserialize<'de> for $name {
                fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                    let text = d.deserialize_any(QuantityText($what))?;
                    let parse: fn(&str) -> Result<$inner, super::UnitError> = $parse;
                    parse(&text)
                        .map($name)
                        .map_err(|e| serde::de::Error::custom(format!("invalid {}: {}", $what, e)))
                }
            }
        };
    }

    quantity!(SizeQ, u64, super::parse_size, "size");
    quantity!(DurationQ, Duration, super::parse_duration, "duration");

    /// Written back as the quantity text it is read from (`"2500us"`), so
    /// parameters recorded with a run read back the same.
    impl serde::Serialize for DurationQ {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(&format!("{}us", self.0.as_secs_f64() * 1e6))
        }
    }
    quantity!(RateQ, Rate, Rate::parse, "rate");
    quantity!(
        BandwidthQ,
        f64,
        |s| match Rate::parse(s)? {
            Rate::BytesPerSec(b) => Ok(b),
            other => Err(super::UnitError(format!(
                "`{s}` is {other}, expected a bandwidth such as `2GB/s`"
            ))),
        },
        "bandwidth"
    );
}
