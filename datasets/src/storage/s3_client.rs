//! The client the cache tier reads a bucket through. With the `s3` feature (the default of this
//! crate; the loader, the worker daemon and the CLI ask for it) that is object_store's S3 client,
//! configured from the standard `AWS_*` environment variables, the AWS profile's keys, region
//! and endpoint where those lack them, and [`S3Settings`]; without it an
//! `s3://` URI still parses, and opening its bucket fails with [`Error::NoS3Client`], so the
//! batch pipeline builds without an HTTP client or TLS.
//!
//! Everything above this module holds the client as a [`Store`] (any object_store
//! implementation), so listings, downloads and ranged reads are written once.

use std::sync::Arc;

use object_store::list::PaginatedListStore;
use object_store::ObjectStore;

use super::options::S3Settings;
use crate::error::{Error, Result};

/// An object store client, as the cache tier holds it.
pub(crate) type Store = dyn ObjectStore;

/// An S3 client for `bucket`: the standard `AWS_*` environment variables and the AWS profile,
/// overridden by `settings`; plain HTTP is allowed for loopback endpoints (test and local
/// servers) or when asked for. Each HTTP request is retried up to `request_retries` times with
/// backoff (connection errors, 5xx, 429) while less than 90 s have passed since it was first
/// sent, so a request that ran into the 120 s request timeout is not (the reads above try
/// again on their own).
#[cfg(feature = "s3")]
pub(super) fn connect(
    bucket: &str,
    settings: &S3Settings,
    request_retries: usize,
) -> Result<Arc<Store>> {
    Ok(Arc::new(build(bucket, settings, request_retries)?))
}

/// The S3 client of [`connect`], as object_store builds it.
#[cfg(feature = "s3")]
fn build(
    bucket: &str,
    settings: &S3Settings,
    request_retries: usize,
) -> Result<object_store::aws::AmazonS3> {
    let timeout_from_env = std::env::var_os("AWS_TIMEOUT").is_some();
    let from_env = with_profile(
        object_store::aws::AmazonS3Builder::from_env(),
        settings,
        &|name| std::env::var(name).ok(),
    )?;
    let builder = configure(
        from_env,
        bucket,
        settings,
        request_retries,
        timeout_from_env,
    );
    builder.build().map_err(|source| Error::ObjectStore {
        uri: format!("s3://{bucket}"),
        source,
    })
}

/// The same client as [`connect`] makes for `bucket`, as a lister of keys by any string prefix
/// (S3's ListObjectsV2 `prefix`, not only a folder's): what a pattern's listing uses, so that
/// `data/train-*.parquet` lists the keys under `data/train-` only.
#[cfg(feature = "s3")]
pub(super) fn connect_lister(
    bucket: &str,
    settings: &S3Settings,
    request_retries: usize,
) -> Result<Arc<dyn PaginatedListStore>> {
    Ok(Arc::new(build(bucket, settings, request_retries)?))
}

/// Without the `s3` feature: no client, an error that says so.
#[cfg(not(feature = "s3"))]
pub(super) fn connect_lister(
    bucket: &str,
    _settings: &S3Settings,
    _request_retries: usize,
) -> Result<Arc<dyn PaginatedListStore>> {
    Err(Error::NoS3Client {
        uri: format!("s3://{bucket}"),
    })
}

/// `builder` (made from the environment, `var`) with what it lacks and neither it nor `settings`
/// gives taken from the AWS profile of the shared files (`aws_profile.rs`): the keys and session
/// token (unless the environment asks for unsigned requests), the region, the endpoint. The
/// files are read only when something is missing, and a profile that cannot give keys fails
/// only where keys were wanted from it.
#[cfg(feature = "s3")]
fn with_profile(
    builder: object_store::aws::AmazonS3Builder,
    settings: &S3Settings,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<object_store::aws::AmazonS3Builder> {
    use object_store::aws::AmazonS3ConfigKey as Key;

    let has = |key: Key| {
        builder
            .get_config_value(&key)
            .is_some_and(|v| !v.is_empty())
    };
    let unsigned = builder
        .get_config_value(&Key::SkipSignature)
        .is_some_and(|v| v == "true");
    // A web identity the environment names (IRSA) comes before the shared files, as in the
    // AWS CLI's chain; object_store's client uses it.
    let web_identity = has(Key::WebIdentityTokenFile) && has(Key::RoleArn);
    let wants_keys =
        settings.access_key_id.is_none() && !has(Key::AccessKeyId) && !unsigned && !web_identity;
    let wants_region = settings.region.is_none() && !has(Key::Region);
    let wants_endpoint =
        settings.endpoint.is_none() && !has(Key::Endpoint) && !has(Key::S3Endpoint);
    if !(wants_keys || wants_region || wants_endpoint) {
        return Ok(builder);
    }
    let profile = match super::aws_profile::read_profile(var) {
        Ok(Some(profile)) => profile,
        Ok(None) => return Ok(builder),
        Err(error) if wants_keys => return Err(error.into()),
        Err(error) => {
            tracing::debug!(%error, "the AWS profile is not used (the environment gives the keys)");
            return Ok(builder);
        }
    };
    let mut builder = builder;
    if wants_keys {
        if let Some((id, secret)) = profile.keys {
            builder = builder
                .with_access_key_id(id)
                .with_secret_access_key(secret);
            if let Some(token) = profile.session_token {
                builder = builder.with_token(token);
            }
        }
    }
    if let Some(region) = profile.region.filter(|_| wants_region) {
        builder = builder.with_region(region);
    }
    if let Some(endpoint) = profile.endpoint_url.filter(|_| wants_endpoint) {
        builder = builder.with_endpoint(endpoint);
    }
    Ok(builder)
}

/// `builder` (made from the environment) for `bucket` with `settings` over it: the retries,
/// a 120 s request timeout unless the environment gave one (`AWS_TIMEOUT`), and plain HTTP
/// where asked for or on loopback. The environment's other client settings (`AWS_ALLOW_HTTP`,
/// `AWS_PROXY_URL`, `AWS_CONNECT_TIMEOUT`...) stay as they are.
#[cfg(feature = "s3")]
fn configure(
    builder: object_store::aws::AmazonS3Builder,
    bucket: &str,
    settings: &S3Settings,
    request_retries: usize,
    timeout_from_env: bool,
) -> object_store::aws::AmazonS3Builder {
    use std::time::Duration;

    use object_store::aws::AmazonS3ConfigKey;
    use object_store::{BackoffConfig, ClientConfigKey, RetryConfig};

    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: request_retries,
        retry_timeout: Duration::from_secs(90),
    };
    let mut builder = builder.with_bucket_name(bucket).with_retry(retry);
    if !timeout_from_env {
        builder = builder.with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), "120s");
    }
    if let Some(endpoint) = &settings.endpoint {
        // Both keys: object_store builds with the S3 one first, which `AWS_ENDPOINT_URL_S3` in
        // the environment sets, so the setting would lose to it.
        builder = builder
            .with_endpoint(endpoint)
            .with_config(AmazonS3ConfigKey::S3Endpoint, endpoint);
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
    // The endpoint the client will use: the S3 one where set, as object_store builds.
    let loopback = builder
        .get_config_value(&AmazonS3ConfigKey::S3Endpoint)
        .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::Endpoint))
        .is_some_and(|endpoint| is_loopback_http(&endpoint));
    if settings.allow_http || loopback {
        builder = builder.with_allow_http(true);
    }
    builder
}

/// Without the `s3` feature: no client, an error that says so.
#[cfg(not(feature = "s3"))]
pub(super) fn connect(
    bucket: &str,
    _settings: &S3Settings,
    _request_retries: usize,
) -> Result<Arc<Store>> {
    Err(Error::NoS3Client {
        uri: format!("s3://{bucket}"),
    })
}

/// Whether `endpoint` is `http://` on 127.0.0.0/8, `localhost` or `[::1]`.
#[cfg(feature = "s3")]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "s3")]
    #[test]
    fn only_http_on_loopback_counts_as_loopback() {
        assert!(is_loopback_http("http://127.0.0.1:9000"));
        assert!(is_loopback_http("http://localhost:9000/"));
        assert!(is_loopback_http("http://[::1]:9000"));
        assert!(!is_loopback_http("https://127.0.0.1:9000"));
        assert!(!is_loopback_http("http://10.0.0.5:9000"));
        assert!(!is_loopback_http("http://s3.example.com"));
    }

    #[cfg(feature = "s3")]
    #[test]
    fn a_bucket_gives_a_client_without_a_request() {
        let settings = S3Settings {
            endpoint: Some("http://127.0.0.1:9".into()),
            ..S3Settings::default()
        };
        assert!(connect("bucket", &settings, 0).is_ok());
    }

    /// A profile's keys fill what the environment lacks, but not beside a web identity the
    /// environment names (IRSA), which comes first as in the AWS CLI's chain.
    #[cfg(feature = "s3")]
    #[test]
    fn a_profiles_keys_are_used_unless_the_environment_names_a_web_identity() {
        use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey as Key};

        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".aws")).unwrap();
        std::fs::write(
            home.path().join(".aws/credentials"),
            "[default]\naws_access_key_id = AKIFILE\naws_secret_access_key = s\n",
        )
        .unwrap();
        let home_dir = home.path().display().to_string();
        let var = |name: &str| (name == "HOME").then(|| home_dir.clone());
        let settings = S3Settings::default();
        let built = with_profile(AmazonS3Builder::new(), &settings, &var).unwrap();
        assert_eq!(
            built.get_config_value(&Key::AccessKeyId).as_deref(),
            Some("AKIFILE")
        );
        let irsa = AmazonS3Builder::new()
            .with_config(Key::WebIdentityTokenFile, "/var/run/secrets/token")
            .with_config(Key::RoleArn, "arn:aws:iam::1:role/pod");
        let built = with_profile(irsa, &settings, &var).unwrap();
        assert_eq!(built.get_config_value(&Key::AccessKeyId), None);
    }

    #[cfg(feature = "s3")]
    #[test]
    fn the_environments_client_settings_are_kept() {
        use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
        use object_store::ClientConfigKey;

        let client = |key| AmazonS3ConfigKey::Client(key);
        // As from_env makes it with AWS_ALLOW_HTTP, AWS_PROXY_URL and AWS_TIMEOUT set.
        let from_env = || {
            AmazonS3Builder::new()
                .with_config(client(ClientConfigKey::AllowHttp), "true")
                .with_config(client(ClientConfigKey::ProxyUrl), "http://proxy:3128")
                .with_config(client(ClientConfigKey::Timeout), "7s")
        };
        let settings = S3Settings::default();
        let built = configure(from_env(), "bucket", &settings, 3, true);
        let value = |key| built.get_config_value(&client(key));
        assert_eq!(value(ClientConfigKey::AllowHttp).as_deref(), Some("true"));
        assert_eq!(
            value(ClientConfigKey::ProxyUrl).as_deref(),
            Some("http://proxy:3128")
        );
        assert_eq!(value(ClientConfigKey::Timeout).as_deref(), Some("7s"));
        // Without AWS_TIMEOUT the request timeout is Stoker's.
        let ours = configure(AmazonS3Builder::new(), "bucket", &settings, 3, false);
        assert_eq!(
            ours.get_config_value(&client(ClientConfigKey::Timeout))
                .as_deref(),
            Some("120s")
        );
    }

    #[cfg(feature = "s3")]
    #[test]
    fn the_settings_endpoint_beats_the_environments_s3_endpoint() {
        use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
        use object_store::ClientConfigKey;

        // As from_env makes it with AWS_ENDPOINT_URL_S3 set.
        let from_env = || {
            AmazonS3Builder::new()
                .with_config(AmazonS3ConfigKey::S3Endpoint, "https://elsewhere.example")
        };
        let settings = S3Settings {
            endpoint: Some("http://127.0.0.1:9000".into()),
            ..S3Settings::default()
        };
        let built = configure(from_env(), "bucket", &settings, 3, false);
        for key in [AmazonS3ConfigKey::S3Endpoint, AmazonS3ConfigKey::Endpoint] {
            assert_eq!(
                built.get_config_value(&key).as_deref(),
                Some("http://127.0.0.1:9000")
            );
        }
        // The environment's S3 endpoint alone, on loopback over HTTP, is allowed as the
        // setting would be.
        let local = AmazonS3Builder::new()
            .with_config(AmazonS3ConfigKey::S3Endpoint, "http://localhost:9000");
        let built = configure(local, "bucket", &S3Settings::default(), 3, false);
        let allow = built.get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp));
        assert_eq!(allow.as_deref(), Some("true"));
    }

    #[cfg(not(feature = "s3"))]
    #[test]
    fn without_the_feature_a_bucket_is_refused_by_name() {
        let Err(error) = connect("bucket", &S3Settings::default(), 0) else {
            panic!("a build without the s3 feature made an S3 client");
        };
        assert!(matches!(&error, Error::NoS3Client { uri } if uri == "s3://bucket"));
        assert!(error.to_string().contains("`s3` feature"), "{error}");
    }
}
