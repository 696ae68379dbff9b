//! Process CPU time and peak memory from `getrusage`.

use std::time::Duration;

/// CPU time (user + system) and peak resident set of this process so far.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    /// User plus system CPU time.
    pub cpu: Duration,
    /// Peak resident set size in bytes.
    pub peak_rss_bytes: u64,
}

fn timeval(tv: libc::timeval) -> Duration {
    Duration::from_secs(tv.tv_sec as u64) + Duration::from_micros(tv.tv_usec as u64)
}

/// Reads this process's usage.
pub fn usage() -> Usage {
    // SAFETY: an all-zero rusage is a valid value; getrusage fills it.
    let mut raw: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out pointer cannot fail.
    let status = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut raw) };
    if status != 0 {
        return Usage {
            cpu: Duration::ZERO,
            peak_rss_bytes: 0,
        };
    }
    Usage {
        cpu: timeval(raw.ru_utime) + timeval(raw.ru_stime),
        // Linux reports kilobytes.
        peak_rss_bytes: raw.ru_maxrss as u64 * 1024,
    }
}
