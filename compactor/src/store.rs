//! Opening the object store named by a URL: `file:///dir` (or a plain path), `memory://`,
//! `s3://bucket[/prefix]`, `gs://bucket[/prefix]`, `az://container[/prefix]`. Cloud settings
//! (endpoint, region, credentials, `AWS_ALLOW_HTTP`) come from the usual environment variables
//! (`AWS_*`, `GOOGLE_*`, `AZURE_*`), as each provider's own tools read them.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
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

/// Opens the store named by `url`; the URL's path (after the bucket) becomes a prefix under which
/// every object of this deployment lives.
pub fn open(url: &str) -> Result<Store> {
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
        "s3" | "s3a" => Arc::new(
            AmazonS3Builder::from_env()
                .with_url(url)
                .with_retry(retry_config())
                .build()?,
        ),
        "gs" => Arc::new(
            GoogleCloudStorageBuilder::from_env()
                .with_url(url)
                .with_retry(retry_config())
                .build()?,
        ),
        "az" | "azure" | "abfs" | "abfss" => Arc::new(
            MicrosoftAzureBuilder::from_env()
                .with_url(url)
                .with_retry(retry_config())
                .build()?,
        ),
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
    let fs = LocalFileSystem::new_with_prefix(dir)?.with_automatic_cleanup(true);
    Ok(Arc::new(fs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

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
    }
}
