//! The object store side of the cache tier: listings, whole objects and byte ranges downloaded
//! by parallel ranged GETs (large ones in parts, neighbouring small ones of an object together),
//! each retried with exponential backoff and jitter; whole reads and puts of small objects (the
//! tar index), files uploaded in parts (`stoker convert --out s3://`), and deletes.
//!
//! Two retry layers, on purpose: the S3 client's own (`s3_client.rs`) retries each HTTP request
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
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, ObjectMeta, ObjectStoreExt};
use tracing::{debug, warn};

use super::listed::Listed;
use super::s3_client::Store;
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
    /// The version the object was listed as: every GET asks for it (If-Match on its ETag)
    /// and checks the answer is of it.
    pub(super) listed: Listed,
    /// Bytes to fetch: the whole object's size, or a range's length.
    pub(super) size: u64,
    /// Where the bytes start in the object (0 for a whole object).
    pub(super) offset: u64,
    /// The temporary file the parts are written into, and its path (for messages).
    pub(super) file: Arc<File>,
    pub(super) part: std::path::PathBuf,
}

/// The objects directly under the location's prefix (not in sub-"folders"), sorted by key; a
/// prefix that names one object gives that object.
pub(super) async fn list_objects(
    store: &Store,
    location: &RemoteLocation,
) -> Result<Vec<ObjectMeta>> {
    Ok(list_objects_and_folders(store, location).await?.0)
}

/// [`list_objects`], with the folders directly under the prefix (their keys, ending in `/`).
pub(super) async fn list_objects_and_folders(
    store: &Store,
    location: &RemoteLocation,
) -> Result<(Vec<ObjectMeta>, Vec<String>)> {
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
    let mut folders: Vec<String> = listing
        .common_prefixes
        .iter()
        .map(|folder| format!("{folder}/"))
        .collect();
    folders.sort();
    Ok((objects, folders))
}

/// The objects of `bucket` whose keys start with `key_prefix` (any string, not only a folder),
/// every page of them: those in `key_prefix`'s folder only (`/` as the delimiter) unless `deep`,
/// in key order; and, not `deep`, the folders below that one the listing names (their keys,
/// ending in `/`).
pub(super) async fn list_key_prefix(
    lister: &dyn PaginatedListStore,
    bucket: &str,
    key_prefix: &str,
    deep: bool,
) -> Result<(Vec<ObjectMeta>, Vec<String>)> {
    let mut objects = Vec::new();
    let mut folders = Vec::new();
    let mut page_token = None;
    loop {
        let options = PaginatedListOptions {
            delimiter: (!deep).then_some(std::borrow::Cow::Borrowed("/")),
            page_token: page_token.take(),
            ..PaginatedListOptions::default()
        };
        let prefix = (!key_prefix.is_empty()).then_some(key_prefix);
        let page = lister
            .list_paginated(prefix, options)
            .await
            .map_err(|source| Error::ObjectStore {
                uri: format!("s3://{bucket}/{key_prefix}"),
                source,
            })?;
        objects.extend(page.result.objects);
        folders.extend(
            page.result
                .common_prefixes
                .iter()
                .map(|folder| format!("{folder}/")),
        );
        match page.page_token {
            Some(next) => page_token = Some(next),
            None => break,
        }
    }
    objects.sort_by(|a, b| a.location.cmp(&b.location));
    folders.sort();
    Ok((objects, folders))
}

/// Neighbouring ranges of one object at most this far apart are fetched by one GET (the bytes
/// between them are read and dropped): a tar shard's samples are separated by their headers and
/// label members.
pub(super) const MAX_COALESCE_GAP: u64 = 64 * 1024;

/// One GET: `span` of the object of `downloads[first]`, giving either a part of that one
/// download (`part_of`) or the whole of each download in `whole`.
struct Request {
    first: usize,
    span: Range<u64>,
    part_of: Option<usize>,
    whole: Vec<usize>,
}

/// The GETs that fetch `downloads`: a download larger than `part_size` in parts of that size,
/// and smaller ones of the same object that lie within [`MAX_COALESCE_GAP`] of each other
/// together, up to `part_size` per GET.
fn plan_requests(downloads: &[Download], part_size: u64) -> Vec<Request> {
    let part_size = part_size.max(1);
    let mut order: Vec<usize> = (0..downloads.len()).collect();
    order.sort_by(|&a, &b| {
        (&downloads[a].key, downloads[a].offset).cmp(&(&downloads[b].key, downloads[b].offset))
    });
    let mut requests: Vec<Request> = Vec::new();
    for position in order {
        let download = &downloads[position];
        let end = download.offset.saturating_add(download.size);
        if download.size > part_size {
            let mut start = download.offset;
            while start < end {
                let stop = end.min(start.saturating_add(part_size));
                requests.push(Request {
                    first: position,
                    span: start..stop,
                    part_of: Some(position),
                    whole: Vec::new(),
                });
                start = stop;
            }
            continue;
        }
        if let Some(last) = requests.last_mut() {
            let same_object = last.part_of.is_none() && downloads[last.first].key == download.key;
            if same_object
                && download.offset >= last.span.end
                && download.offset - last.span.end <= MAX_COALESCE_GAP
                && end - last.span.start <= part_size
            {
                last.span.end = end;
                last.whole.push(position);
                continue;
            }
        }
        requests.push(Request {
            first: position,
            span: download.offset..end,
            part_of: None,
            whole: vec![position],
        });
    }
    requests
}

/// Fetches every download into its file, `plan.concurrency` GETs at a time.
/// Each download is handed to `done` (by its index) as soon as its last GET has landed, so its
/// caller commits it and lets other processes have it while the rest are still on their way;
/// the first error (a GET's or `done`'s) ends the downloads not yet done.
pub(super) async fn download_all(
    store: Arc<Store>,
    downloads: &[Download],
    plan: FetchPlan,
    counters: &Counters,
    done: &(dyn Fn(usize) -> Result<()> + Sync),
) -> Result<()> {
    let requests = plan_requests(downloads, plan.part_size);
    let mut left = vec![0usize; downloads.len()];
    for request in &requests {
        for &position in request.part_of.iter().chain(&request.whole) {
            left[position] += 1;
        }
    }
    let mut results = stream::iter(requests)
        .map(|request| {
            let store = Arc::clone(&store);
            async move {
                let covered: Vec<usize> = request
                    .part_of
                    .iter()
                    .chain(&request.whole)
                    .copied()
                    .collect();
                fetch_request(&store, downloads, request, plan, counters)
                    .await
                    .map(|()| covered)
            }
        })
        .buffer_unordered(plan.concurrency.max(1));
    while let Some(result) = results.next().await {
        for position in result? {
            left[position] -= 1;
            if left[position] == 0 {
                done(position)?;
            }
        }
    }
    Ok(())
}

fn is_transient(error: &object_store::Error) -> bool {
    !refused_for_the_request(&error.to_string())
        && !matches!(
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

/// Whether the store answered with a 4xx status other than a timeout (408) or a rate limit
/// (429), as object_store writes it: the request itself is refused (an expired session token,
/// a signature for another region, a malformed request), and sent again it fails again.
/// object_store gives these as a generic error, status and store's code in its text.
fn refused_for_the_request(text: &str) -> bool {
    text.split("non-2xx status code: ").skip(1).any(|status| {
        status.starts_with('4') && !status.starts_with("408") && !status.starts_with("429")
    })
}

/// The pause before try `attempt + 1`: 200 ms doubling up to 10 s, with full jitter in the
/// upper half so that readers which failed together do not retry together.
fn backoff(attempt: u32) -> Duration {
    let ceiling_ms = 200u64.saturating_mul(1 << attempt.min(6)).min(10_000);
    // A fresh RandomState is randomly keyed: enough randomness for jitter without a dependency.
    let random = RandomState::new().build_hasher().finish();
    Duration::from_millis(ceiling_ms / 2 + random % (ceiling_ms / 2 + 1))
}

/// One GET with retries; its bytes go to the file of the download it is a part of, or are cut
/// into the downloads it covers.
async fn fetch_request(
    store: &Store,
    downloads: &[Download],
    request: Request,
    plan: FetchPlan,
    counters: &Counters,
) -> Result<()> {
    let first = &downloads[request.first];
    let range = request.span.clone();
    let bytes = get_range(
        store,
        &first.key,
        &first.uri,
        &first.listed,
        range.clone(),
        plan,
        counters,
    )
    .await?;
    if let Some(position) = request.part_of {
        let download = &downloads[position];
        let at = range.start - download.offset;
        return write_at(download, bytes, at).await;
    }
    for &position in &request.whole {
        let download = &downloads[position];
        let from = (download.offset - range.start) as usize;
        let piece = bytes.slice(from..from + download.size as usize);
        write_at(download, piece, 0).await?;
    }
    Ok(())
}

/// Bytes `range` of the object `key` (`uri` in messages), in memory: one ranged GET, tried
/// again with backoff after a transient failure or a short answer, up to `plan.max_attempts`.
/// The GET asks for the version `listed` (If-Match on its ETag): an object rewritten since is
/// [`Error::ObjectChanged`], never bytes of the new version at the old version's offsets, also
/// from a store that ignores the If-Match or lists no ETags (the answer's size, ETag, or
/// last-modified time is compared: [`Listed::answered_by_another`]). An empty range is empty
/// bytes, without a request.
#[allow(clippy::too_many_arguments)]
pub(super) async fn get_range(
    store: &Store,
    key: &str,
    uri: &str,
    listed: &Listed,
    range: Range<u64>,
    plan: FetchPlan,
    counters: &Counters,
) -> Result<bytes::Bytes> {
    if range.is_empty() {
        return Ok(bytes::Bytes::new());
    }
    let path = ObjectPath::parse(key).map_err(|source| Error::InvalidUri {
        uri: uri.to_string(),
        reason: source.to_string(),
    })?;
    let wanted = range.end - range.start;
    let mut attempt = 1;
    loop {
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let options = GetOptions {
            range: Some(range.clone().into()),
            if_match: listed.e_tag.clone(),
            ..GetOptions::default()
        };
        let answer = match store.get_opts(&path, options).await {
            // A store that ignored the If-Match (some S3-compatible ones do) answered with
            // another version: its bytes are never taken for the listed one's.
            Ok(answer) if listed.answered_by_another(&answer.meta) => {
                return Err(Error::ObjectChanged {
                    uri: uri.to_string(),
                });
            }
            Ok(answer) => answer.bytes().await,
            Err(error) => Err(error),
        };
        let error = match answer {
            Ok(bytes) if bytes.len() as u64 == wanted => {
                counters.bytes_fetched.fetch_add(wanted, Ordering::Relaxed);
                return Ok(bytes);
            }
            Ok(bytes) => Error::IncompleteObject {
                uri: format!("{uri} (bytes {}..{})", range.start, range.end),
                expected: wanted,
                received: bytes.len() as u64,
            },
            Err(object_store::Error::Precondition { .. }) => {
                return Err(Error::ObjectChanged {
                    uri: uri.to_string(),
                })
            }
            Err(source) => {
                let transient = is_transient(&source);
                let error = Error::ObjectStore {
                    uri: uri.to_string(),
                    source,
                };
                if !transient {
                    return Err(error);
                }
                error
            }
        };
        if attempt >= plan.max_attempts {
            return Err(error);
        }
        let pause = backoff(attempt);
        counters.retries.fetch_add(1, Ordering::Relaxed);
        warn!(
            %uri,
            start = range.start,
            end = range.end,
            attempt,
            pause_ms = pause.as_millis() as u64,
            %error,
            "ranged read failed; retrying"
        );
        tokio::time::sleep(pause).await;
        attempt += 1;
    }
}

/// Writes `bytes` as the object `key` of `location`'s bucket.
pub(super) async fn put(
    store: &Store,
    location: &RemoteLocation,
    key: &str,
    bytes: Vec<u8>,
) -> Result<()> {
    let uri = location.uri_of(key);
    let path = ObjectPath::parse(key).map_err(|source| Error::InvalidUri {
        uri: uri.clone(),
        reason: source.to_string(),
    })?;
    store
        .put(&path, object_store::PutPayload::from(bytes))
        .await
        .map_err(|source| Error::ObjectStore { uri, source })?;
    Ok(())
}

/// Writes the file at `file` as the object `key`: in one PUT up to `part_bytes`, else as a
/// multipart upload of `part_bytes` parts (each its own request, retried by the client; a
/// few in flight, one part read from the file at a time), so neither a slow link nor a shard
/// past a PUT's size limit fails the upload. An upload whose part fails while the file is read
/// is aborted here, and one whose completion fails by object_store; a last part failing in the
/// completion leaves its parts to the bucket's lifecycle rules.
pub(super) async fn put_file(
    store: &Store,
    location: &RemoteLocation,
    key: &str,
    file: &std::path::Path,
    part_bytes: usize,
) -> Result<()> {
    let uri = location.uri_of(key);
    let size = std::fs::metadata(file)
        .map_err(|source| Error::io(file, source))?
        .len();
    if size <= part_bytes as u64 {
        let bytes = std::fs::read(file).map_err(|source| Error::io(file, source))?;
        return put(store, location, key, bytes).await;
    }
    let path = ObjectPath::parse(key).map_err(|source| Error::InvalidUri {
        uri: uri.clone(),
        reason: source.to_string(),
    })?;
    let failed = |source| Error::ObjectStore {
        uri: uri.clone(),
        source,
    };
    let upload = store.put_multipart(&path).await.map_err(failed)?;
    let mut writer = object_store::WriteMultipart::new_with_chunk_size(upload, part_bytes);
    let mut reader = File::open(file).map_err(|source| Error::io(file, source))?;
    let mut buffer = vec![0u8; part_bytes];
    let written: Result<()> = async {
        loop {
            writer
                .wait_for_capacity(PARTS_IN_FLIGHT)
                .await
                .map_err(failed)?;
            let read =
                read_full(&mut reader, &mut buffer).map_err(|source| Error::io(file, source))?;
            if read == 0 {
                return Ok(());
            }
            writer.write(&buffer[..read]);
        }
    }
    .await;
    match written {
        Ok(()) => writer.finish().await.map(drop).map_err(failed),
        Err(error) => {
            if let Err(abort) = writer.abort().await {
                debug!(%uri, error = %abort, "cannot abort the multipart upload");
            }
            Err(error)
        }
    }
}

/// Parts of one multipart upload in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

/// Reads into `buffer` until it is full or the file ends; the bytes read.
fn read_full(reader: &mut File, buffer: &mut [u8]) -> std::io::Result<usize> {
    use std::io::Read;
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// Deletes the object `key` (one already gone is no error).
pub(super) async fn delete(store: &Store, location: &RemoteLocation, key: &str) -> Result<()> {
    let uri = location.uri_of(key);
    let path = ObjectPath::parse(key).map_err(|source| Error::InvalidUri {
        uri: uri.clone(),
        reason: source.to_string(),
    })?;
    match store.delete(&path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(source) => Err(Error::ObjectStore { uri, source }),
    }
}

/// Writes `bytes` at `offset` of `download`'s part file off the async threads.
async fn write_at(download: &Download, bytes: bytes::Bytes, offset: u64) -> Result<()> {
    let file = Arc::clone(&download.file);
    let uri = download.uri.as_str();
    let written = tokio::task::spawn_blocking(move || file.write_all_at(&bytes, offset))
        .await
        .map_err(std::io::Error::other)
        .and_then(|result| result);
    written.map_err(|source| {
        debug!(uri, offset, error = %source, "cannot write a downloaded part");
        Error::cache(&download.part, source)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_request_the_store_refuses_is_not_tried_again() {
        let generic = |text: &str| object_store::Error::Generic {
            store: "S3",
            source: text.to_string().into(),
        };
        let expired = "Error performing GET http://s3/b/k in 10ms - Server returned non-2xx \
                       status code: 400 Bad Request: <Code>ExpiredToken</Code>";
        assert!(!super::is_transient(&generic(expired)));
        for passing in [
            "Server returned non-2xx status code: 503 Service Unavailable: SlowDown",
            "Server returned non-2xx status code: 429 Too Many Requests: ",
            "Server returned non-2xx status code: 408 Request Timeout: ",
            "error sending request: connection refused",
        ] {
            assert!(super::is_transient(&generic(passing)), "{passing}");
        }
    }

    use super::*;

    fn download(key: &str, offset: u64, size: u64) -> Download {
        Download {
            key: key.into(),
            listed: Listed::default(),
            uri: format!("s3://b/{key}"),
            size,
            offset,
            file: Arc::new(tempfile::tempfile().unwrap()),
            part: format!("{key}.stoker-part-0-0").into(),
        }
    }

    #[test]
    fn neighbouring_ranges_of_one_object_share_a_get_and_large_ones_split() {
        let downloads = [
            download("a", 1000, 100),
            download("a", 0, 100),
            download("b", 150, 10),
            download("a", 100 + MAX_COALESCE_GAP + 1000, 50),
            download("a", 2000, 20_000),
        ];
        let requests = plan_requests(&downloads, 8192);
        let spans: Vec<(Range<u64>, Vec<usize>, Option<usize>)> = requests
            .iter()
            .map(|r| (r.span.clone(), r.whole.clone(), r.part_of))
            .collect();
        assert_eq!(
            spans,
            vec![
                (0..1100, vec![1, 0], None),
                (2000..10192, vec![], Some(4)),
                (10192..18384, vec![], Some(4)),
                (18384..22000, vec![], Some(4)),
                (
                    100 + MAX_COALESCE_GAP + 1000..100 + MAX_COALESCE_GAP + 1050,
                    vec![3],
                    None
                ),
                (150..160, vec![2], None),
            ]
        );
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
