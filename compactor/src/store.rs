//! Opening the object store named by a URL: `file:///dir` (or a plain path), `memory://`,
//! `s3://bucket[/prefix]`, `gs://bucket[/prefix]`, `az://container[/prefix]`. Cloud settings
//! (endpoint, region, credentials, `AWS_ALLOW_HTTP`) come from the usual environment variables
//! (`AWS_*`, `GOOGLE_*`, `AZURE_*`), as each provider's own tools read them.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{BackoffConfig, ObjectStore, RetryConfig};

use crate::error::{Error, Result};

/// The object store every part of the compactor shares.
pub type Store = Arc<dyn ObjectStore>;

/// Retries the cloud clients make inside one request before the compactor sees the failure.
/// Kept small: the compactor has its own, unbounded backoff around each checkpoint round, and a
/// short inner loop lets it report "behind" promptly.
const CLIENT_MAX_RETRIES: usize = 3;
/// Upper bound of one request's inner retries.
const CLIENT_RETRY_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest pause between the inner retries.
const CLIENT_MAX_BACKOFF: Duration = Duration::from_secs(2);

fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: CLIENT_MAX_BACKOFF,
            base: 2.0,
        },
        max_retries: CLIENT_MAX_RETRIES,
        retry_timeout: CLIENT_RETRY_TIMEOUT,
    }
}

fn bad(url: &str, reason: impl std::fmt::Display) -> Error {
    Error::BadUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    }
}

/// Bound on one HTTP request to a cloud store (unless `<PREFIX>TIMEOUT` is set).
const CLIENT_TIMEOUT: &str = "30s";
/// Bound on connecting to a cloud store (unless `<PREFIX>CONNECT_TIMEOUT` is set).
const CLIENT_CONNECT_TIMEOUT: &str = "5s";

/// Applies our client defaults (where the environment sets none) and then `options` to a
/// builder through `set` (which parses the key for its provider; unknown keys are refused).
fn configure<B>(
    mut builder: B,
    env_prefix: &str,
    options: &[(String, String)],
    set: impl Fn(B, &str, &str) -> std::result::Result<B, String>,
) -> std::result::Result<B, String> {
    for (key, value) in [
        ("timeout", CLIENT_TIMEOUT),
        ("connect_timeout", CLIENT_CONNECT_TIMEOUT),
    ] {
        if std::env::var_os(format!("{env_prefix}{}", key.to_ascii_uppercase())).is_none() {
            builder = set(builder, key, value)?;
        }
    }
    for (key, value) in options {
        builder = set(builder, &key.to_ascii_lowercase(), value)?;
    }
    Ok(builder)
}

/// Opens the store named by `url`; the URL's path (after the bucket) becomes a prefix under which
/// every object of this deployment lives. Cloud settings come from the environment.
pub fn open(url: &str) -> Result<Store> {
    open_with(url, &[])
}

/// `open`, with provider settings given explicitly (keys as the environment variables, lower
/// case: `aws_endpoint_url`, `aws_allow_http`, ...); they take precedence over the environment.
pub fn open_with(url: &str, options: &[(String, String)]) -> Result<Store> {
    if !url.contains("://") {
        return open_dir(std::path::Path::new(url), url);
    }
    let parsed = url::Url::parse(url).map_err(|e| bad(url, e))?;
    let prefix = Path::parse(parsed.path().trim_start_matches('/')).map_err(|e| bad(url, e))?;
    let store: Store = match parsed.scheme() {
        "file" => {
            let dir = parsed
                .to_file_path()
                .map_err(|()| bad(url, "not a local absolute path"))?;
            return open_dir(&dir, url);
        }
        "memory" => Arc::new(InMemory::new()),
        "s3" | "s3a" => {
            let b = configure(AmazonS3Builder::from_env(), "AWS_", options, |b, k, v| {
                match k.parse::<AmazonS3ConfigKey>() {
                    Ok(key) => Ok(b.with_config(key, v)),
                    Err(e) => Err(e.to_string()),
                }
            })
            .map_err(|e| bad(url, e))?;
            Arc::new(b.with_url(url).with_retry(retry_config()).build()?)
        }
        "gs" => {
            let b = configure(
                GoogleCloudStorageBuilder::from_env(),
                "GOOGLE_",
                options,
                |b, k, v| match k.parse::<GoogleConfigKey>() {
                    Ok(key) => Ok(b.with_config(key, v)),
                    Err(e) => Err(e.to_string()),
                },
            )
            .map_err(|e| bad(url, e))?;
            Arc::new(b.with_url(url).with_retry(retry_config()).build()?)
        }
        "az" | "azure" | "abfs" | "abfss" => {
            let b = configure(
                MicrosoftAzureBuilder::from_env(),
                "AZURE_",
                options,
                |b, k, v| match k.parse::<AzureConfigKey>() {
                    Ok(key) => Ok(b.with_config(key, v)),
                    Err(e) => Err(e.to_string()),
                },
            )
            .map_err(|e| bad(url, e))?;
            Arc::new(b.with_url(url).with_retry(retry_config()).build()?)
        }
        other => return Err(bad(url, format!("unsupported scheme {other:?}"))),
    };
    if prefix.as_ref().is_empty() {
        Ok(store)
    } else {
        Ok(Arc::new(PrefixStore::new(store, prefix)))
    }
}

fn open_dir(dir: &std::path::Path, url: &str) -> Result<Store> {
    std::fs::create_dir_all(dir).map_err(|e| bad(url, format!("create {}: {e}", dir.display())))?;
    // fsync: the journal is trimmed once a checkpoint and its manifest are written, so they must
    // be on disk by then, as an S3 PUT is when it returns (object_store's default is no fsync).
    let fs = LocalFileSystem::new_with_prefix(dir)?
        .with_automatic_cleanup(true)
        .with_fsync(true);
    Ok(Arc::new(fs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    /// The trim that follows a publication relies on it being durable; the setting is only
    /// visible through the store's `Debug` form.
    #[test]
    fn local_dirs_fsync_what_they_write() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&format!("file://{}", dir.path().display())).unwrap();
        let shown = format!("{store:?}");
        assert!(shown.contains("fsync: true"), "{shown}");
    }

    #[tokio::test]
    async fn opens_local_dirs_by_url_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        let url = format!("file://{}", sub.display());
        let s = open(&url).unwrap();
        s.put(&Path::from("x/y"), b"hi".to_vec().into())
            .await
            .unwrap();
        assert!(sub.join("x/y").exists());
        let s2 = open(sub.to_str().unwrap()).unwrap();
        let got = s2
            .get(&Path::from("x/y"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(&got[..], b"hi");
    }

    #[test]
    fn refuses_unknown_schemes() {
        assert!(matches!(open("ftp://x/y"), Err(Error::BadUrl { .. })));
    }

    #[test]
    fn s3_urls_build_without_network() {
        // Building a client does no I/O; the bucket comes from the URL.
        open("s3://bucket/some/prefix").unwrap();
        let opts = [(
            "AWS_ENDPOINT_URL".to_string(),
            "http://127.0.0.1:1".to_string(),
        )];
        open_with("s3://bucket", &opts).unwrap();
        let bad_opts = [("aws_no_such_setting".to_string(), "x".to_string())];
        assert!(matches!(
            open_with("s3://bucket", &bad_opts),
            Err(Error::BadUrl { .. })
        ));
    }
}
