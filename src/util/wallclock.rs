//! The wall clock: seconds since the Unix epoch, and the UTC timestamp
//! that names default output directories. (The TSC clock for measuring
//! intervals is `clock`.)

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Now as `YYYYmmdd-HHMMSS` in UTC.
pub(crate) fn utc_stamp() -> String {
    utc_stamp_of(unix_now() as i64)
}

/// `secs` since the epoch as `YYYYmmdd-HHMMSS` in UTC.
pub(crate) fn utc_stamp_of(secs: i64) -> String {
    let (y, m, d, rem) = civil(secs);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Now as `YYYY-mm-ddTHH:MM:SSZ` (ISO 8601, UTC), as the image scripts
/// write `built_at`.
pub(crate) fn utc_iso() -> String {
    utc_iso_of(unix_now() as i64)
}

/// `secs` since the epoch as `YYYY-mm-ddTHH:MM:SSZ`.
pub(crate) fn utc_iso_of(secs: i64) -> String {
    let (y, m, d, rem) = civil(secs);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The UTC year, month, day and seconds into the day of `secs` since the
/// epoch (Howard Hinnant's civil_from_days).
fn civil(secs: i64) -> (i64, i64, i64, i64) {
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, rem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_format() {
        let s = utc_stamp();
        assert_eq!(s.len(), 15, "{s}");
        assert!(s.starts_with("20"), "{s}");
    }

    #[test]
    fn stamps_of_known_instants() {
        assert_eq!(utc_stamp_of(0), "19700101-000000");
        // 2000-02-29 (a leap day of a century leap year) 12:34:56.
        assert_eq!(utc_stamp_of(951_827_696), "20000229-123456");
        assert_eq!(utc_stamp_of(1_735_689_599), "20241231-235959");
        assert_eq!(utc_iso_of(951_827_696), "2000-02-29T12:34:56Z");
        assert_eq!(utc_iso_of(0), "1970-01-01T00:00:00Z");
    }
}
