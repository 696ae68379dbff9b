//! A token file (nanoGPT `.bin` layout) in an object store: opening reads the listing only (the
//! object's size gives the windows); each window is a ranged GET through the cache, read ahead
//! like tar samples.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::aws::AmazonS3;
use object_store::ObjectMeta;
use tracing::{info, warn};

use super::cache::ObjectCache;
use super::prefetch::Prefetcher;
use super::uri::{s3_location, RemoteLocation};
use crate::cache_stats::CacheStats;
use crate::error::{Error, Result};
use crate::sample_source::{SampleSource, TokenWindowShape};
use crate::token_dtype::TokenDtype;
use crate::token_file::MAX_SEQ_LEN;

/// Windows of `seq_len + 1` tokens of one token file at `s3://BUCKET/KEY`, window `i` starting
/// at token `i * seq_len`, as [`TokenFile`](crate::TokenFile) cuts a local one.
pub struct RemoteTokenFile {
    location: RemoteLocation,
    cache: Arc<ObjectCache>,
    store: Arc<AmazonS3>,
    object: ObjectMeta,
    uri: String,
    dtype: TokenDtype,
    seq_len: u32,
    windows: u64,
    prefetcher: Option<Prefetcher>,
}

impl RemoteTokenFile {
    /// Opens the token file `uri` names (one object); `dtype` `None` takes it from the name
    /// (`*.u32.bin`: uint32, else uint16).
    pub fn open(
        uri: &str,
        cache: Arc<ObjectCache>,
        dtype: Option<TokenDtype>,
        seq_len: u32,
    ) -> Result<RemoteTokenFile> {
        if seq_len == 0 || seq_len > MAX_SEQ_LEN {
            return Err(Error::InvalidArgument(format!(
                "token windows need seq_len in 1..={MAX_SEQ_LEN}, got {seq_len}"
            )));
        }
        let location = s3_location(
            uri,
            "a token file in an object store is named by s3://BUCKET/KEY",
        )?;
        let store = cache.store(&location)?;
        let listing = cache.list(&store, &location)?;
        let object = match listing.as_slice() {
            [object] => object.clone(),
            [] => {
                return Err(Error::NoRemoteObjects {
                    uri: location.uri(),
                    what: "token file".into(),
                })
            }
            _ => {
                return Err(Error::InvalidUri {
                    uri: location.uri(),
                    reason: format!(
                        "{} objects are listed there; name one token file (s3://BUCKET/KEY.bin)",
                        listing.len()
                    ),
                })
            }
        };
        let uri = location.uri_of(object.location.as_ref());
        let path = PathBuf::from(&uri);
        let dtype = dtype.unwrap_or_else(|| TokenDtype::from_file_name(Path::new(&uri)));
        let bytes = object.size;
        if bytes % dtype.size() as u64 != 0 {
            return Err(Error::TokenFileSize {
                path,
                bytes,
                dtype: dtype.name(),
            });
        }
        let tokens = bytes / dtype.size() as u64;
        let window = u64::from(seq_len) + 1;
        if tokens < window {
            return Err(Error::TokenFileTooShort {
                path,
                tokens,
                window,
            });
        }
        let windows = (tokens - 1) / u64::from(seq_len);
        info!(%uri, tokens, windows, dtype = dtype.name(), "opened token file in the object store");
        let prefetcher =
            Prefetcher::start(Arc::clone(&cache), Arc::clone(&store), location.clone())
                .map_err(|error| warn!(%error, "cannot start the read-ahead thread"))
                .ok();
        Ok(RemoteTokenFile {
            location,
            cache,
            store,
            object,
            uri,
            dtype,
            seq_len,
            windows,
            prefetcher,
        })
    }

    /// Bytes of one window.
    fn window_bytes(&self) -> u64 {
        (u64::from(self.seq_len) + 1) * self.dtype.size() as u64
    }

    /// The byte range of window `index`.
    fn range(&self, index: u64) -> std::ops::Range<u64> {
        let start = index * u64::from(self.seq_len) * self.dtype.size() as u64;
        start..start + self.window_bytes()
    }
}

impl SampleSource for RemoteTokenFile {
    fn len(&self) -> u64 {
        self.windows
    }

    /// Token windows have no class: always 0.
    fn label(&self, _index: u64) -> i64 {
        0
    }

    fn describe(&self, index: u64) -> String {
        let start = index.saturating_mul(u64::from(self.seq_len));
        format!(
            "{}:tokens[{start}..{})",
            self.uri,
            start.saturating_add(u64::from(self.seq_len) + 1)
        )
    }

    fn read(&self, index: u64) -> Result<Vec<u8>> {
        if index >= self.windows {
            return Err(Error::IndexOutOfRange {
                index,
                len: self.windows,
            });
        }
        let range = self.range(index);
        let mut bytes = self.cache.read_ranges(
            &self.store,
            &self.location,
            &self.object,
            std::slice::from_ref(&range),
        )?;
        Ok(bytes.pop().unwrap_or_default())
    }

    fn class_names(&self) -> &[String] {
        &[]
    }

    fn token_windows(&self) -> Option<TokenWindowShape> {
        Some(TokenWindowShape {
            dtype: self.dtype,
            seq_len: self.seq_len,
        })
    }

    fn prefetch(&self, indices: &[u64]) {
        if let Some(prefetcher) = &self.prefetcher {
            let ranges = indices
                .iter()
                .filter(|&&index| index < self.windows)
                .map(|&index| self.range(index))
                .collect();
            prefetcher.hint(vec![(self.object.clone(), ranges)]);
        }
    }

    fn cache_stats(&self) -> Option<CacheStats> {
        Some(self.cache.stats())
    }
}
