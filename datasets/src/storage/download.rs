//! The object store side of the cache tier: the S3 client, listings, and whole-object downloads
//! made of parallel ranged GETs, each retried with exponential backoff and jitter.
//!
//! Two retry layers, on purpose: object_store's own [`RetryConfig`] retries each HTTP request
//! (connection refused, 5xx, timeouts), and the loop here retries a part whose body was cut
//! short or whose request still failed, so a server restart in the middle of a shard costs one
//! part, not the shard.

use std::collections::hash_map::RandomState;
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, ObjectMeta, ObjectStore, ObjectStoreExt, RetryConfig,
};
use tracing::{debug, warn};

use super::options::S3Settings;
use super::stats::Counters;
use super::uri::RemoteLocation;
use crate::error::{Error, Result};

/// How downloads are split and retried.
#[derive(Debug, Clone, Copy)]
pub(super) struct FetchPlan {
    /// Bytes per ranged GET.
    pub(super) part_size: u64,
    /// Ranged GETs in flight at once, over all objects of a fetch.
    pub(super) concurrency: usize,
    /// Tries per part (the first one included).
    pub(super) max_attempts: u32,
}

/// One object to download into an already created (and exclusively locked) temporary file.
pub(super) struct Download {
    /// The object's key in the bucket.
    pub(super) key: String,
    /// Its `s3://` URI, for messages.
    pub(super) uri: String,
    /// Its size according to the listing.
    pub(super) size: u64,
    /// The temporary file the parts are written into.
    pub(super) file: Arc<File>,
}

/// An S3 client for `bucket`: the standard `AWS_*` environment variables, overridden by
/// `settings`; plain HTTP is allowed for loopback endpoints (test and local servers) or when
/// asked for.
pub(super) fn build_store(
    bucket: &str,
    settings: &S3Settings,
    request_retries: usize,
) -> Result<AmazonS3> {
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: request_retries,
        retry_timeout: Duration::from_secs(90),
    };
    let client = ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(120));
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_retry(retry)
        .with_client_options(client);
    if let Some(endpoint) = &settings.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(key) = &settings.access_key_id {
        builder = builder.with_access_key_id(key);
    }
    if let Some(secret) = &settings.secret_access_key {
        builder = builder.with_secret_access_key(secret);
    }
    if let Some(region) = &settings.region {
        builder = builder.with_region(region);
    }
    let loopback = builder
        .get_config_value(&AmazonS3ConfigKey::Endpoint)
        .is_some_and(|endpoint| is_loopback_http(&endpoint));
    if settings.allow_http || loopback {
        builder = builder.with_allow_http(true);
    }
    builder.build().map_err(|source| Error::ObjectStore {
        uri: format!("s3://{bucket}"),
        source,
    })
}

/// Whether `endpoint` is `http://` on 127.0.0.0/8, `localhost` or `[::1]`.
fn is_loopback_http(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback())
}

/// The objects directly under the location's prefix (not in sub-"folders"), sorted by key; a
/// prefix that names one object gives that object.
pub(super) async fn list_objects(
    store: &AmazonS3,
    location: &RemoteLocation,
) -> Result<Vec<ObjectMeta>> {
    let prefix = match location.prefix.as_str() {
        "" => None,
        prefix => Some(
            ObjectPath::parse(prefix).map_err(|source| Error::InvalidUri {
                uri: location.uri(),
                reason: source.to_string(),
            })?,
        ),
    };
    let listing = store
        .list_with_delimiter(prefix.as_ref())
        .await
        .map_err(|source| Error::ObjectStore {
            uri: location.uri(),
            source,
        })?;
    let mut objects = listing.objects;
    if objects.is_empty() && listing.common_prefixes.is_empty() {
        if let Some(prefix) = &prefix {
            match store.head(prefix).await {
                Ok(meta) => objects.push(meta),
                Err(object_store::Error::NotFound { .. }) => {}
                Err(source) => {
                    return Err(Error::ObjectStore {
                        uri: location.uri(),
                        source,
                    })
                }
            }
        }
    }
    objects.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(objects)
}

/// Downloads every object of `downloads` into its file, `plan.concurrency` parts at a time
/// over all of them. The first part that fails all its tries fails the whole call (the parts
/// still in flight are dropped).
pub(super) async fn download_all(
    store: Arc<AmazonS3>,
    downloads: &[Download],
    plan: FetchPlan,
    counters: &Counters,
) -> Result<()> {
    let part_size = plan.part_size.max(1);
    let mut parts = Vec::new();
    for (position, download) in downloads.iter().enumerate() {
        let mut start = 0;
        while start < download.size {
            let end = download.size.min(start.saturating_add(part_size));
            parts.push((position, start..end));
            start = end;
        }
    }
    let mut results = stream::iter(parts)
        .map(|(position, range)| {
            let store = Arc::clone(&store);
            let download = &downloads[position];
            async move { fetch_part(&store, download, range, plan, counters).await }
        })
        .buffer_unordered(plan.concurrency.max(1));
    while let Some(result) = results.next().await {
        result?;
    }
    Ok(())
}

/// Whether an object store error may go away on a later try.
fn is_transient(error: &object_store::Error) -> bool {
    !matches!(
        error,
        object_store::Error::NotFound { .. }
            | object_store::Error::InvalidPath { .. }
            | object_store::Error::NotSupported { .. }
            | object_store::Error::NotImplemented { .. }
            | object_store::Error::Precondition { .. }
            | object_store::Error::NotModified { .. }
            | object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. }
            | object_store::Error::UnknownConfigurationKey { .. }
    )
}

/// The pause before try `attempt + 1`: 200 ms doubling up to 10 s, with full jitter in the
/// upper half so that readers which failed together do not retry together.
fn backoff(attempt: u32) -> Duration {
    let ceiling_ms = 200u64.saturating_mul(1 << attempt.min(6)).min(10_000);
    // A fresh RandomState is randomly keyed: enough randomness for jitter without a dependency.
    let random = RandomState::new().build_hasher().finish();
    Duration::from_millis(ceiling_ms / 2 + random % (ceiling_ms / 2 + 1))
}

/// Fetches one part with retries and writes it at its offset.
async fn fetch_part(
    store: &AmazonS3,
    download: &Download,
    range: Range<u64>,
    plan: FetchPlan,
    counters: &Counters,
) -> Result<()> {
    let location = ObjectPath::parse(&download.key).map_err(|source| Error::InvalidUri {
        uri: download.uri.clone(),
        reason: source.to_string(),
    })?;
    let wanted = range.end - range.start;
    let mut attempt = 1;
    loop {
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let error = match store.get_range(&location, range.clone()).await {
            Ok(bytes) if bytes.len() as u64 == wanted => {
                write_at(&download.file, bytes, range.start, &download.uri).await?;
                counters.bytes_fetched.fetch_add(wanted, Ordering::Relaxed);
                return Ok(());
            }
            Ok(bytes) => Error::IncompleteObject {
                uri: format!("{} (bytes {}..{})", download.uri, range.start, range.end),
                expected: wanted,
                received: bytes.len() as u64,
            },
            Err(source) if !is_transient(&source) => {
                return Err(Error::ObjectStore {
                    uri: download.uri.clone(),
                    source,
                })
            }
            Err(source) => Error::ObjectStore {
                uri: download.uri.clone(),
                source,
            },
        };
        if attempt >= plan.max_attempts {
            return Err(error);
        }
        let pause = backoff(attempt);
        counters.retries.fetch_add(1, Ordering::Relaxed);
        warn!(
            uri = %download.uri,
            start = range.start,
            end = range.end,
            attempt,
            pause_ms = pause.as_millis() as u64,
            error = %error,
            "ranged read failed; retrying"
        );
        tokio::time::sleep(pause).await;
        attempt += 1;
    }
}

/// Writes `bytes` at `offset` of `file` off the async threads.
async fn write_at(file: &Arc<File>, bytes: bytes::Bytes, offset: u64, uri: &str) -> Result<()> {
    let file = Arc::clone(file);
    let written = tokio::task::spawn_blocking(move || file.write_all_at(&bytes, offset))
        .await
        .map_err(std::io::Error::other)
        .and_then(|result| result);
    written.map_err(|source| {
        debug!(uri, offset, error = %source, "cannot write a downloaded part");
        Error::io(uri, source)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_on_loopback_counts_as_loopback() {
        assert!(is_loopback_http("http://127.0.0.1:9000"));
        assert!(is_loopback_http("http://localhost:9000/"));
        assert!(is_loopback_http("http://[::1]:9000"));
        assert!(!is_loopback_http("https://127.0.0.1:9000"));
        assert!(!is_loopback_http("http://10.0.0.5:9000"));
        assert!(!is_loopback_http("http://s3.example.com"));
    }

    #[test]
    fn backoff_grows_and_stays_bounded() {
        for attempt in 1..20 {
            let pause = backoff(attempt);
            let ceiling = 200u64.saturating_mul(1 << attempt.min(6)).min(10_000);
            assert!(pause.as_millis() as u64 >= ceiling / 2, "attempt {attempt}");
            assert!(pause.as_millis() as u64 <= ceiling, "attempt {attempt}");
        }
        assert!(backoff(1) < Duration::from_millis(500));
    }
}
