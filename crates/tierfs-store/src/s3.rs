//! S3-compatible targets (`s3://bucket[/prefix][?endpoint=URL&region=NAME]`), through
//! `object_store`'s Amazon S3 client: signed requests, retries with exponential backoff on
//! throttling (429/503), other 5xx and lost connections, multipart uploads for large objects
//! and parallel ranged reads for large ranges.
//!
//! The endpoint and region are part of the target URL recorded in the metadata engine, so
//! every client reaches the same store; the credentials are not (see [`crate::credentials`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig, WriteMultipart,
};

use crate::credentials::{self, Credentials};
use crate::error::{Result, StoreError};

/// Objects larger than this are uploaded in parts.
pub const MULTIPART_THRESHOLD: usize = 16 << 20;
/// Size of one part of a multipart upload (S3 wants at least 5 MiB but for the last).
pub const PART_SIZE: usize = 8 << 20;
/// Parts of one object uploaded at once.
pub const PART_CONCURRENCY: usize = 4;
/// Ranged reads longer than this are split into requests of this size, fetched in parallel.
pub const RANGE_SPLIT: u64 = 8 << 20;

/// Where an S3 target is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Spec {
    pub bucket: String,
    /// Key prefix inside the bucket (no leading or trailing '/'), may be empty.
    pub prefix: String,
    /// Endpoint of an S3-compatible store, e.g. `http://127.0.0.1:3900`; AWS when absent.
    pub endpoint: Option<String>,
    pub region: Option<String>,
}

impl S3Spec {
    /// Parses `bucket[/prefix]` (the part after `s3://`).
    pub fn parse(rest: &str, whole: &str) -> Result<S3Spec> {
        let (bucket, prefix) = match rest.split_once('/') {
            Some((b, p)) => (b, p.trim_matches('/')),
            None => (rest, ""),
        };
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
            && !bucket.starts_with(['-', '.'])
            && !bucket.ends_with(['-', '.']);
        if !bucket_ok {
            return Err(StoreError::BadUrl(format!(
                "{whole}: '{bucket}' is not a valid bucket name (3 to 63 lower-case letters, digits, '-' or '.')"
            )));
        }
        if prefix.split('/').any(|seg| seg == "." || seg == "..")
            || prefix.contains("//")
            || prefix.chars().any(|c| c.is_control())
        {
            return Err(StoreError::BadUrl(format!(
                "{whole}: invalid key prefix '{prefix}'"
            )));
        }
        Ok(S3Spec {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            endpoint: None,
            region: None,
        })
    }

    /// The URL recorded for the target: location, endpoint and region, never credentials.
    pub fn url(&self) -> String {
        let mut u = format!("s3://{}", self.bucket);
        if !self.prefix.is_empty() {
            u.push('/');
            u.push_str(&self.prefix);
        }
        let mut q = Vec::new();
        if let Some(e) = &self.endpoint {
            q.push(format!("endpoint={e}"));
        }
        if let Some(r) = &self.region {
            q.push(format!("region={r}"));
        }
        if !q.is_empty() {
            u.push('?');
            u.push_str(&q.join("&"));
        }
        u
    }

    /// Checks an endpoint given in a URL or with `--s3-endpoint`.
    pub fn check_endpoint(e: &str) -> Result<()> {
        let ok = url::Url::parse(e)
            .map(|u| {
                matches!(u.scheme(), "http" | "https")
                    && u.host().is_some()
                    && u.username().is_empty()
                    && u.password().is_none()
                    && u.query().is_none()
            })
            .unwrap_or(false);
        if ok {
            Ok(())
        } else {
            Err(StoreError::BadUrl(format!(
                "invalid S3 endpoint '{e}' (expected http[s]://host[:port], without credentials)"
            )))
        }
    }

    /// Opens the store with the credentials of [`credentials::resolve`].
    pub fn open(&self) -> Result<Arc<dyn ObjectStore>> {
        self.open_with(&credentials::resolve()?)
    }

    /// Opens the store: the bucket, seen through the prefix.
    pub fn open_with(&self, creds: &Credentials) -> Result<Arc<dyn ObjectStore>> {
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&self.bucket)
            .with_region(self.region.as_deref().unwrap_or("us-east-1"))
            .with_access_key_id(&creds.access_key_id)
            .with_secret_access_key(&creds.secret_access_key)
            .with_retry(retry_config())
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(120))
                    .with_pool_idle_timeout(Duration::from_secs(60)),
            );
        if let Some(t) = &creds.session_token {
            b = b.with_token(t);
        }
        if let Some(e) = &self.endpoint {
            b = b
                .with_endpoint(e)
                .with_allow_http(e.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        let store = b
            .build()
            .map_err(|e| StoreError::BadUrl(format!("{}: {e}", self.url())))?;
        Ok(if self.prefix.is_empty() {
            Arc::new(store)
        } else {
            Arc::new(PrefixStore::new(store, self.prefix.as_str()))
        })
    }
}

/// Retries: exponential backoff from 100 ms up to 5 s, at most 10 tries and 60 s per request.
/// `object_store` retries throttling (429, 503 SlowDown), other 5xx and lost connections, and
/// never a 4xx that a retry cannot fix.
pub fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: 10,
        retry_timeout: Duration::from_secs(60),
    }
}

/// Uploads `data` to `path`: one PUT, or a multipart upload in [`PART_SIZE`] parts above
/// [`MULTIPART_THRESHOLD`] (aborted if a part fails, so no half object is left visible).
pub async fn put(store: &dyn ObjectStore, path: &Path, data: Bytes) -> Result<()> {
    if data.len() <= MULTIPART_THRESHOLD {
        store.put(path, data.into()).await?;
        return Ok(());
    }
    let upload = store.put_multipart(path).await?;
    let mut w = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
    let mut off = 0;
    while off < data.len() {
        if let Err(e) = w.wait_for_capacity(PART_CONCURRENCY).await {
            let _ = w.abort().await;
            return Err(e.into());
        }
        let end = (off + PART_SIZE).min(data.len());
        w.put(data.slice(off..end));
        off = end;
    }
    w.finish().await?;
    Ok(())
}

/// Reads `[start, end)` of `path`, splitting long ranges into parallel requests.
pub async fn get_range(
    store: &dyn ObjectStore,
    path: &Path,
    start: u64,
    end: u64,
) -> Result<Bytes> {
    if end - start <= RANGE_SPLIT {
        return Ok(store.get_range(path, start..end).await?);
    }
    let mut parts = Vec::new();
    let mut s = start;
    while s < end {
        let e = (s + RANGE_SPLIT).min(end);
        parts.push(store.get_range(path, s..e));
        s = e;
    }
    let parts = futures::future::try_join_all(parts).await?;
    let mut out = BytesMut::with_capacity((end - start) as usize);
    for p in parts {
        out.extend_from_slice(&p);
    }
    Ok(out.freeze())
}

/// Runs `f` to completion on a private runtime in a scoped thread: for the synchronous
/// administrative calls (format's checks, `--force` wipes), which may themselves run inside
/// another runtime.
pub fn block_on<F, T>(f: F) -> Result<T>
where
    F: std::future::Future<Output = Result<T>> + Send,
    T: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| StoreError::Io(e.to_string()))?
                .block_on(f)
        })
        .join()
        .unwrap_or_else(|_| Err(StoreError::Io("S3 request thread panicked".into())))
    })
}

/// Writes and removes one small object: reaches the endpoint, finds the bucket and proves the
/// credentials may write (a missing bucket is never created).
pub fn probe(spec: &S3Spec, creds: &Credentials) -> Result<()> {
    probe_store(spec, &spec.open_with(creds)?, creds)
}

/// [`probe`] through a store already opened with `creds`.
pub fn probe_store(spec: &S3Spec, store: &Arc<dyn ObjectStore>, creds: &Credentials) -> Result<()> {
    let probe = Path::from(format!(".tierfs-probe-{}", std::process::id()));
    block_on(async {
        store
            .put(&probe, object_store::PutPayload::from_static(b"probe"))
            .await
            .map_err(|e| explain(spec, &creds.source, e))?;
        let _ = store.delete(&probe).await;
        Ok(())
    })
}

/// Maps an error of a request to a target into the clear ones: the bucket is missing, or the
/// credentials (from `source`) are refused.
pub fn explain(spec: &S3Spec, source: &str, e: object_store::Error) -> StoreError {
    let text = e.to_string();
    let loc = match &spec.endpoint {
        Some(ep) => format!("bucket '{}' at {ep}", spec.bucket),
        None => format!("bucket '{}'", spec.bucket),
    };
    match e {
        object_store::Error::NotFound { .. } => {
            StoreError::Missing(format!("{loc} (no such bucket)"))
        }
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => StoreError::Credentials(format!(
            "{loc} refused the credentials from {source}: {}",
            first_line(&text)
        )),
        _ if text.contains("NoSuchBucket") => {
            StoreError::Missing(format!("{loc} (no such bucket)"))
        }
        _ if text.contains("InvalidAccessKeyId")
            || text.contains("SignatureDoesNotMatch")
            || text.contains("AccessDenied") =>
        {
            StoreError::Credentials(format!(
                "{loc} refused the credentials: {}",
                first_line(&text)
            ))
        }
        _ => StoreError::Unwritable(loc, first_line(&text)),
    }
}

/// The S3 error code and message of a reply body when there is one (`AccessDenied: ...`),
/// else the first line of the error, shortened.
fn first_line(s: &str) -> String {
    let tag = |t: &str| {
        let open = format!("<{t}>");
        let start = s.find(&open)? + open.len();
        let len = s[start..].find(&format!("</{t}>"))?;
        Some(s[start..start + len].to_string())
    };
    if let Some(code) = tag("Code") {
        return match tag("Message") {
            Some(m) => format!("{code}: {m}"),
            None => code,
        };
    }
    if s.contains("error sending request") {
        return "cannot reach the endpoint (no connection, after retries)".into();
    }
    s.lines().next().unwrap_or("").chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_buckets_and_prefixes() {
        let s = S3Spec::parse("bucket-a/ost0", "s3://bucket-a/ost0").unwrap();
        assert_eq!(s.bucket, "bucket-a");
        assert_eq!(s.prefix, "ost0");
        assert_eq!(s.url(), "s3://bucket-a/ost0");
        let s = S3Spec::parse("bucket-a", "s3://bucket-a").unwrap();
        assert_eq!(s.prefix, "");
        let s = S3Spec::parse("bucket-a/a/b/", "s3://bucket-a/a/b/").unwrap();
        assert_eq!(s.prefix, "a/b");
        for bad in ["", "ab", "Upper", "-x-y", "a_b", "x/../y", "xyz/a//b"] {
            assert!(S3Spec::parse(bad, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn endpoints_are_checked() {
        assert!(S3Spec::check_endpoint("http://127.0.0.1:3900").is_ok());
        assert!(S3Spec::check_endpoint("https://s3.example.org").is_ok());
        assert!(S3Spec::check_endpoint("ftp://x").is_err());
        assert!(S3Spec::check_endpoint("http://key:secret@host").is_err());
        assert!(S3Spec::check_endpoint("not a url").is_err());
    }
}
