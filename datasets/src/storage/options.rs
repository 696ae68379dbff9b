//! How the cache tier is configured: the cache folder, its size cap, how downloads are split
//! and retried, and the S3 connection settings, in code or from `STOKER_CACHE_*` variables.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

/// Bytes per ranged GET by default.
pub const DEFAULT_PART_SIZE: u64 = 8 * 1024 * 1024;
/// Ranged GETs in flight at once by default.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// The cache cap when `STOKER_CACHE_MAX_BYTES` is not set: 64 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024 * 1024;

/// S3 connection settings that override the standard `AWS_*` environment variables
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
/// `AWS_ALLOW_HTTP`...) and the AWS profile's shared files. `None` leaves the environment's
/// value.
#[derive(Clone, Default)]
pub struct S3Settings {
    /// Endpoint URL of an S3-compatible server (`http://127.0.0.1:9000`).
    pub endpoint: Option<String>,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// Allow plain HTTP to a non-loopback endpoint (loopback endpoints always may).
    pub allow_http: bool,
}

impl std::fmt::Debug for S3Settings {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .field("region", &self.region)
            .field("allow_http", &self.allow_http)
            .finish()
    }
}

/// How an [`ObjectCache`](super::ObjectCache) stores, fetches and evicts.
#[derive(Debug, Clone)]
pub struct ObjectCacheOptions {
    /// The cache folder.
    pub dir: PathBuf,
    /// Evict least-recently-used entries once the cached objects add up to more than this.
    pub max_bytes: u64,
    /// Bytes per ranged GET.
    pub part_size: u64,
    /// Ranged GETs in flight at once.
    pub concurrency: usize,
    /// Tries per ranged GET before a fetch fails (each try is itself retried by the client on
    /// connection errors and 5xx answers, `request_retries` times within 90 s); an answer
    /// refusing the request itself (a 4xx but 408 and 429: an expired token, another region) is
    /// not tried again.
    pub max_attempts: u32,
    /// Retries of one HTTP request by the object store client (exponential backoff from
    /// 100 ms up to 5 s) before it reports a failure.
    pub request_retries: usize,
    /// How long to wait for an entry another process is fetching, counted from its last write
    /// to the entry's part file (a download that keeps coming is waited out): past it,
    /// [`ObjectCache::fetch`](super::ObjectCache::fetch) of whole objects fails. Reads of
    /// byte ranges (samples, an index) wait 3 s at most (or this, if shorter), then read from
    /// the store past the cache.
    pub lock_timeout: Duration,
    /// Connection settings over the `AWS_*` environment variables.
    pub s3: S3Settings,
}

impl ObjectCacheOptions {
    /// Defaults with the cache in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> ObjectCacheOptions {
        ObjectCacheOptions {
            dir: dir.into(),
            max_bytes: DEFAULT_MAX_BYTES,
            part_size: DEFAULT_PART_SIZE,
            concurrency: DEFAULT_CONCURRENCY,
            max_attempts: 6,
            request_retries: 8,
            lock_timeout: Duration::from_secs(600),
            s3: S3Settings::default(),
        }
    }

    /// Options from the environment: `STOKER_CACHE_DIR` (default
    /// `$XDG_CACHE_HOME/stoker/objects`, else `~/.cache/stoker/objects`),
    /// `STOKER_CACHE_MAX_BYTES` (bytes, or with a K/M/G/T suffix in powers of 1024; default
    /// 64G) and `STOKER_CACHE_LOCK_TIMEOUT_SECS` (default 600).
    pub fn from_env() -> Result<ObjectCacheOptions> {
        let dir = match std::env::var_os("STOKER_CACHE_DIR") {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => default_user_cache_dir()
                .map(|dir| dir.join("objects"))
                .ok_or_else(|| {
                    Error::CacheConfig(
                        "no cache folder: set STOKER_CACHE_DIR (or HOME / XDG_CACHE_HOME)".into(),
                    )
                })?,
        };
        let mut options = ObjectCacheOptions::new(dir);
        if let Ok(text) = std::env::var("STOKER_CACHE_MAX_BYTES") {
            options.max_bytes = parse_byte_size(&text).ok_or_else(|| {
                Error::CacheConfig(format!(
                    "STOKER_CACHE_MAX_BYTES={text:?} is not a size (bytes, or 512M, 20G...)"
                ))
            })?;
        }
        if let Ok(text) = std::env::var("STOKER_CACHE_LOCK_TIMEOUT_SECS") {
            let seconds: u64 = text.trim().parse().map_err(|_| {
                Error::CacheConfig(format!(
                    "STOKER_CACHE_LOCK_TIMEOUT_SECS={text:?} is not a number of seconds"
                ))
            })?;
            options.lock_timeout = Duration::from_secs(seconds);
        }
        Ok(options)
    }
}

/// `123`, `512K`, `20G`, `1.5T`... in bytes (suffixes are powers of 1024).
fn parse_byte_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let multiplier: u64 = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return None,
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier);
    }
    let value: f64 = number.parse().ok()?;
    let bytes = value * multiplier as f64;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// `$XDG_CACHE_HOME/stoker`, else `$HOME/.cache/stoker`; `None` when neither is set.
pub(crate) fn default_user_cache_dir() -> Option<PathBuf> {
    let from_xdg = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|path| path.is_absolute());
    let base = from_xdg.or_else(|| {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|path| path.is_absolute())
            .map(|home| home.join(".cache"))
    })?;
    Some(base.join("stoker"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_byte_size("123"), Some(123));
        assert_eq!(parse_byte_size("4K"), Some(4096));
        assert_eq!(parse_byte_size("20G"), Some(20 << 30));
        assert_eq!(parse_byte_size("20GiB"), Some(20 << 30));
        assert_eq!(parse_byte_size("1.5M"), Some(3 << 19));
        assert_eq!(parse_byte_size("lots"), None);
        assert_eq!(parse_byte_size("5Q"), None);
    }
}
