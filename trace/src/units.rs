//! Human units for text a person reads: sizes in binary units, durations
//! from nanoseconds to seconds, counts with thousands separators. JSON
//! output never uses these; it keeps exact numbers in the unit its key says.

/// `bytes` in B, KiB, MiB, GiB or TiB, three significant digits at most
/// (`512 B`, `4 KiB`, `1.50 MiB`, `20.0 GiB`).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{} {}", three_digits(value), UNITS[unit])
}

/// A byte rate per second, as [`human_bytes`] with `/s`.
pub fn human_rate(bytes_per_s: f64) -> String {
    format!("{}/s", human_bytes(bytes_per_s.max(0.0).round() as u64))
}

/// `ns` as ns, µs, ms or s, three significant digits at most.
pub fn human_ns(ns: f64) -> String {
    let ns = ns.max(0.0);
    if ns == 0.0 {
        return "0".into();
    }
    let (value, unit) = if ns < 1e3 {
        (ns, "ns")
    } else if ns < 1e6 {
        (ns / 1e3, "µs")
    } else if ns < 1e9 {
        (ns / 1e6, "ms")
    } else {
        (ns / 1e9, "s")
    };
    format!("{} {unit}", three_digits(value))
}

/// Microseconds, as [`human_ns`].
pub fn human_us(us: f64) -> String {
    human_ns(us * 1e3)
}

/// Milliseconds, as [`human_ns`].
pub fn human_ms(ms: f64) -> String {
    human_ns(ms * 1e6)
}

/// `n` with a comma every three digits (`81,234`).
pub fn human_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `value` with as many decimals as leave three significant digits (at
/// least the integer part): 1.23, 12.3, 123, 1023.
fn three_digits(value: f64) -> String {
    // Round first, so 9.996 prints as 10.0, not 10.00.
    let decimals = |v: f64| -> usize {
        if v < 10.0 {
            2
        } else if v < 100.0 {
            1
        } else {
            0
        }
    };
    let scale = 10f64.powi(decimals(value) as i32);
    let rounded = (value * scale).round() / scale;
    format!("{rounded:.*}", decimals(rounded))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(4096), "4.00 KiB");
        assert_eq!(human_bytes(1536 << 10), "1.50 MiB");
        assert_eq!(human_bytes(20 << 30), "20.0 GiB");
        assert_eq!(human_bytes((1 << 20) - 1), "1024 KiB");
        assert_eq!(human_bytes(5 << 40), "5.00 TiB");
        assert_eq!(human_rate(1.5 * 1048576.0), "1.50 MiB/s");
    }

    #[test]
    fn durations() {
        assert_eq!(human_ns(850.0), "850 ns");
        assert_eq!(human_us(85.0), "85.0 µs");
        assert_eq!(human_us(1234.0), "1.23 ms");
        assert_eq!(human_ms(7926.004), "7.93 s");
        assert_eq!(human_ns(9_996.0), "10.0 µs");
        assert_eq!(human_ns(-1.0), "0");
        assert_eq!(human_ns(0.4), "0.40 ns");
    }

    #[test]
    fn counts() {
        assert_eq!(human_count(0), "0");
        assert_eq!(human_count(999), "999");
        assert_eq!(human_count(1000), "1,000");
        assert_eq!(human_count(81234), "81,234");
        assert_eq!(human_count(1_234_567), "1,234,567");
    }
}
