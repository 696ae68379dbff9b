//! Dataset URIs: a plain path, `file://PATH`, or `s3://BUCKET/PREFIX`.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// Where a dataset lives, as its URI says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetLocation {
    /// A local path (a plain path or `file://PATH`).
    Local(PathBuf),
    /// Objects of an S3 (or S3-compatible) bucket.
    S3(RemoteLocation),
}

/// A bucket and a key prefix in an object store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteLocation {
    /// The bucket name.
    pub bucket: String,
    /// The key prefix without leading or trailing `/` (empty: the whole bucket).
    pub prefix: String,
}

impl RemoteLocation {
    /// The `s3://` URI of `key` in this location's bucket.
    pub fn uri_of(&self, key: &str) -> String {
        format!("s3://{}/{}", self.bucket, key)
    }

    /// The key of `name` under the prefix (`name` itself when the prefix is the whole bucket);
    /// `key_of("")` is the key prefix of every object under it (`prefix/`, or empty).
    pub fn key_of(&self, name: &str) -> String {
        match self.prefix.as_str() {
            "" => name.to_string(),
            prefix => format!("{prefix}/{name}"),
        }
    }

    /// The `s3://` URI of the prefix itself.
    pub fn uri(&self) -> String {
        self.uri_of(&self.prefix)
    }
}

/// The `s3://` location `uri` names; a local path is an [`Error::InvalidUri`] giving `reason`.
pub(crate) fn s3_location(uri: &str, reason: &str) -> Result<RemoteLocation> {
    match parse_dataset_uri(uri)? {
        DatasetLocation::S3(location) => Ok(location),
        DatasetLocation::Local(_) => Err(Error::InvalidUri {
            uri: uri.to_string(),
            reason: reason.to_string(),
        }),
    }
}

/// Parses a dataset URI. Schemes other than `file` and `s3` are refused with an error that
/// names the supported ones.
pub fn parse_dataset_uri(uri: &str) -> Result<DatasetLocation> {
    let trimmed = uri.trim();
    if let Some(path) = trimmed.strip_prefix("file://") {
        return Ok(DatasetLocation::Local(PathBuf::from(path)));
    }
    let Some((scheme, rest)) = trimmed.split_once("://") else {
        return Ok(DatasetLocation::Local(PathBuf::from(trimmed)));
    };
    // A path such as `./a://b` is not a URI: schemes are letters, digits, `+`, `-`, `.`.
    let is_scheme = scheme
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !is_scheme {
        return Ok(DatasetLocation::Local(PathBuf::from(trimmed)));
    }
    if !scheme.eq_ignore_ascii_case("s3") {
        return Err(Error::UnsupportedScheme {
            uri: uri.to_string(),
            scheme: scheme.to_string(),
        });
    }
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(Error::InvalidUri {
            uri: uri.to_string(),
            reason: "the bucket name is empty (expected s3://BUCKET/PREFIX)".into(),
        });
    }
    let prefix = prefix.trim_matches('/');
    if prefix.split('/').any(|segment| {
        segment == "." || segment == ".." || (segment.is_empty() && !prefix.is_empty())
    }) {
        return Err(Error::InvalidUri {
            uri: uri.to_string(),
            reason: "the key prefix has an empty, `.` or `..` segment".into(),
        });
    }
    Ok(DatasetLocation::S3(RemoteLocation {
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(bucket: &str, prefix: &str) -> DatasetLocation {
        DatasetLocation::S3(RemoteLocation {
            bucket: bucket.into(),
            prefix: prefix.into(),
        })
    }

    #[test]
    fn plain_paths_and_file_uris_are_local() {
        assert_eq!(
            parse_dataset_uri("/data/train").unwrap(),
            DatasetLocation::Local("/data/train".into())
        );
        assert_eq!(
            parse_dataset_uri("file:///data/train").unwrap(),
            DatasetLocation::Local("/data/train".into())
        );
        assert_eq!(
            parse_dataset_uri("relative/dir").unwrap(),
            DatasetLocation::Local("relative/dir".into())
        );
    }

    #[test]
    fn s3_uris_split_into_bucket_and_prefix() {
        assert_eq!(
            parse_dataset_uri("s3://b/train/").unwrap(),
            remote("b", "train")
        );
        assert_eq!(parse_dataset_uri("s3://b/a/b").unwrap(), remote("b", "a/b"));
        assert_eq!(parse_dataset_uri("s3://b").unwrap(), remote("b", ""));
        assert_eq!(parse_dataset_uri("S3://b/x").unwrap(), remote("b", "x"));
    }

    #[test]
    fn bad_uris_are_refused_with_reasons() {
        let error = parse_dataset_uri("gs://bucket/x").unwrap_err();
        assert!(matches!(error, Error::UnsupportedScheme { ref scheme, .. } if scheme == "gs"));
        assert!(error.to_string().contains("s3://BUCKET/PREFIX"));
        assert!(matches!(
            parse_dataset_uri("s3:///x").unwrap_err(),
            Error::InvalidUri { .. }
        ));
        assert!(matches!(
            parse_dataset_uri("s3://b/a/../c").unwrap_err(),
            Error::InvalidUri { .. }
        ));
        assert!(matches!(
            parse_dataset_uri("s3://b/a//c").unwrap_err(),
            Error::InvalidUri { .. }
        ));
    }
}
