//! casblk's object store client: [`cas::objects::Objects`] over the S3 API
//! (built for Garage; any S3 store works), through the `object_store`
//! crate, with one client per endpoint and failover between them.
//!
//! Owns: the runtime the async client runs on (two worker threads; callers
//! are the engine's plain threads and block on it), the endpoint list and
//! which one is current, the probe that runs at open (can we reach it, are
//! the credentials and bucket right, does it enforce conditional creates),
//! and the mapping of S3 failures onto [`ObjectErrorKind`] with a one-line
//! message naming the store.
//!
//! Failover: Garage serves the same bucket from every node, so each node is
//! an endpoint. A request that cannot reach the current endpoint (or gets a
//! server error after its retries) is sent to the next; the first that
//! answers becomes current. Every request is bounded (`request_timeout`,
//! `connect_timeout`, a few retries), so a dead cluster is an error within
//! about `endpoints * (retry_timeout + request_timeout)`, never a hang.

mod classify;
pub mod settings;
pub mod testing;
pub use settings::RemoteSettings;

use cas::objects::{ObjectError, ObjectErrorKind, ObjectInfo, ObjectResult, Objects};
use futures_util::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig,
};
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Where the bucket is and how to reach it.
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    /// `http://host:port` of each node serving the bucket (at least one).
    pub endpoints: Vec<String>,
    pub bucket: String,
    /// Key prefix inside the bucket (empty, or ending in `/`).
    pub prefix: String,
    pub region: String,
    pub key_id: String,
    pub secret: String,
    /// One request's bound (default 30 s).
    pub request_timeout: Duration,
    /// Connecting to an endpoint (default 2 s).
    pub connect_timeout: Duration,
    /// Retries of one request at one endpoint, and their time bound
    /// (default 2 within 5 s), before the next endpoint is tried.
    pub retries: usize,
    pub retry_timeout: Duration,
    /// Sign requests without hashing their bodies (`UNSIGNED-PAYLOAD`):
    /// saves a SHA-256 pass over every uploaded byte; the body is then
    /// protected only by TLS (https endpoints) or TCP. Default false.
    pub unsigned_payload: bool,
}

impl RemoteConfig {
    /// A configuration with the default bounds.
    pub fn new(
        endpoints: Vec<String>,
        bucket: &str,
        region: &str,
        key_id: &str,
        secret: &str,
    ) -> RemoteConfig {
        RemoteConfig {
            endpoints,
            bucket: bucket.to_string(),
            prefix: String::new(),
            region: region.to_string(),
            key_id: key_id.to_string(),
            secret: secret.to_string(),
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(2),
            retries: 2,
            retry_timeout: Duration::from_secs(5),
            unsigned_payload: false,
        }
    }
}

impl RemoteConfig {
    /// The configuration `ci/garage start` writes to its `env` file
    /// (`CASBLK_GARAGE_ENDPOINTS`, `_BUCKET`, `_REGION`, `_KEY_ID`,
    /// `_SECRET`), with the default bounds: what the tests and
    /// `ci/bench remote` connect with.
    pub fn from_garage_env(path: &std::path::Path) -> Result<RemoteConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let vars: std::collections::HashMap<&str, &str> =
            text.lines().filter_map(|l| l.split_once('=')).collect();
        let var = |k: &str| vars.get(k).copied().ok_or_else(|| format!("{}: no {k}", path.display()));
        Ok(RemoteConfig::new(
            var("CASBLK_GARAGE_ENDPOINTS")?.split(',').map(str::to_string).collect(),
            var("CASBLK_GARAGE_BUCKET")?,
            var("CASBLK_GARAGE_REGION")?,
            var("CASBLK_GARAGE_KEY_ID")?,
            var("CASBLK_GARAGE_SECRET")?,
        ))
    }
}

/// The bucket, over S3. See the module docs.
pub struct S3Objects {
    runtime: tokio::runtime::Runtime,
    /// (endpoint URL, client), in the configured order.
    clients: Vec<(String, AmazonS3)>,
    current: AtomicUsize,
    bucket: String,
    prefix: String,
    enforce_put_new: bool,
}

impl S3Objects {
    /// Connects and probes: lists the prefix (which fails with a one-line
    /// error for an unreachable store, refused credentials or a missing
    /// bucket), then finds whether the store enforces conditional creates.
    pub fn open(cfg: RemoteConfig) -> ObjectResult<S3Objects> {
        let mut s = S3Objects::unprobed(cfg)?;
        s.list("", None, 1)?;
        s.enforce_put_new = s.probe_put_new()?;
        Ok(s)
    }

    /// Builds the clients without talking to the store.
    pub fn unprobed(cfg: RemoteConfig) -> ObjectResult<S3Objects> {
        let invalid = |m: String| ObjectError::new(ObjectErrorKind::Other, m);
        if cfg.endpoints.is_empty() {
            return Err(invalid(format!("s3://{}: no endpoint given", cfg.bucket)));
        }
        if !(cfg.prefix.is_empty() || cfg.prefix.ends_with('/')) {
            return Err(invalid(format!("s3://{}: prefix '{}' must end in '/'", cfg.bucket, cfg.prefix)));
        }
        // TLS endpoints use rustls with ring (see Cargo.toml); installing
        // the provider twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("casblk-s3")
            .enable_all()
            .build()
            .map_err(|e| invalid(format!("s3://{}: cannot start the client's runtime: {e}", cfg.bucket)))?;
        let mut clients = Vec::with_capacity(cfg.endpoints.len());
        for endpoint in &cfg.endpoints {
            let options = ClientOptions::new()
                .with_allow_http(true)
                .with_timeout(cfg.request_timeout)
                .with_connect_timeout(cfg.connect_timeout);
            let retry = RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(50),
                    max_backoff: Duration::from_secs(1),
                    base: 2.0,
                },
                max_retries: cfg.retries,
                retry_timeout: cfg.retry_timeout,
            };
            let client = AmazonS3Builder::new()
                .with_endpoint(endpoint)
                .with_bucket_name(&cfg.bucket)
                .with_region(&cfg.region)
                .with_access_key_id(&cfg.key_id)
                .with_secret_access_key(&cfg.secret)
                .with_virtual_hosted_style_request(false)
                .with_unsigned_payload(cfg.unsigned_payload)
                .with_client_options(options)
                .with_retry(retry)
                .build()
                .map_err(|e| invalid(format!("s3://{} at {endpoint}: {e}", cfg.bucket)))?;
            clients.push((endpoint.clone(), client));
        }
        Ok(S3Objects {
            runtime,
            clients,
            current: AtomicUsize::new(0),
            bucket: cfg.bucket,
            prefix: cfg.prefix,
            enforce_put_new: false,
        })
    }

    /// The endpoint requests go to now.
    pub fn current_endpoint(&self) -> &str {
        &self.clients[self.current.load(Ordering::Relaxed) % self.clients.len()].0
    }

    /// Writes a probe key twice with a conditional create: a store that
    /// refuses the second enforces `put_new`. The probe key is deleted.
    fn probe_put_new(&self) -> ObjectResult<bool> {
        let key = format!("probe/{:016x}", rand::random::<u64>());
        let create = || {
            self.request(&key, |c, p| async move {
                let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
                c.put_opts(&p, PutPayload::from_static(b"probe"), opts).await.map(|_| ())
            })
        };
        create()?;
        let enforced = match create() {
            Ok(()) => false,
            Err(e) if e.kind == ObjectErrorKind::Exists => true,
            Err(e) => return Err(e),
        };
        self.delete(&key)?;
        Ok(enforced)
    }

    fn path(&self, key: &str) -> ObjectPath {
        ObjectPath::from(format!("{}{key}", self.prefix))
    }

    /// Runs one request, failing over between endpoints: an endpoint that
    /// cannot be reached (or answers with server errors past its retries)
    /// hands the request to the next; other failures return at once.
    fn request<T, F, Fut>(&self, key: &str, op: F) -> ObjectResult<T>
    where
        F: Fn(AmazonS3, ObjectPath) -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        let n = self.clients.len();
        let first = self.current.load(Ordering::Relaxed) % n;
        let path = self.path(key);
        let mut failures = Vec::new();
        for i in 0..n {
            let at = (first + i) % n;
            let (endpoint, client) = &self.clients[at];
            match self.runtime.block_on(op(client.clone(), path.clone())) {
                Ok(v) => {
                    if at != first {
                        tracing::warn!(from = %self.clients[first].0, to = %endpoint, "object store endpoint failed over");
                        self.current.store(at, Ordering::Relaxed);
                    }
                    return Ok(v);
                }
                Err(e) => {
                    let kind = classify::kind(&e);
                    let message =
                        format!("s3://{}/{} at {endpoint}: {}", self.bucket, path, classify::summary(&e));
                    if !matches!(kind, ObjectErrorKind::Unreachable | ObjectErrorKind::Other) {
                        return Err(ObjectError::new(kind, message));
                    }
                    failures.push((kind, message));
                }
            }
        }
        let (kind, last) = failures.pop().expect("at least one endpoint");
        let message = if n == 1 { last } else { format!("none of {n} endpoints answered; last: {last}") };
        Err(ObjectError::new(kind, message))
    }
}

impl Objects for S3Objects {
    fn describe(&self) -> String {
        format!("s3://{}/{} at {}", self.bucket, self.prefix, self.current_endpoint())
    }

    fn put(&self, key: &str, data: &[u8]) -> ObjectResult<()> {
        let payload = PutPayload::from(bytes::Bytes::copy_from_slice(data));
        self.request(key, |c, p| {
            let payload = payload.clone();
            async move { c.put(&p, payload).await.map(|_| ()) }
        })
    }

    fn put_new(&self, key: &str, data: &[u8]) -> ObjectResult<()> {
        if !self.enforce_put_new {
            return Err(ObjectError::new(
                ObjectErrorKind::Unsupported,
                format!("{}: this store does not enforce conditional writes", self.describe()),
            ));
        }
        let payload = PutPayload::from(bytes::Bytes::copy_from_slice(data));
        self.request(key, |c, p| {
            let payload = payload.clone();
            async move {
                let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
                c.put_opts(&p, payload, opts).await.map(|_| ())
            }
        })
    }

    fn enforces_put_new(&self) -> bool {
        self.enforce_put_new
    }

    fn get(&self, key: &str) -> ObjectResult<Vec<u8>> {
        self.request(key, |c, p| async move {
            let bytes = c.get_opts(&p, GetOptions::new()).await?.bytes().await?;
            Ok(bytes.to_vec())
        })
    }

    fn get_range(&self, key: &str, range: Range<u64>) -> ObjectResult<Vec<u8>> {
        if range.start >= range.end {
            return Ok(Vec::new());
        }
        self.request(key, |c, p| {
            let range = range.clone();
            async move { Ok(c.get_range(&p, range).await?.to_vec()) }
        })
    }

    fn head(&self, key: &str) -> ObjectResult<Option<u64>> {
        match self.request(key, |c, p| async move { c.head(&p).await.map(|m| m.size) }) {
            Ok(size) => Ok(Some(size)),
            Err(e) if e.kind == ObjectErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn list(&self, prefix: &str, start_after: Option<&str>, limit: usize) -> ObjectResult<Vec<ObjectInfo>> {
        let strip = self.prefix.len();
        let offset = start_after.map(|k| self.path(k));
        let dir = prefix.trim_end_matches('/').to_string();
        let keys = self.request(&dir, |c, p| {
            let offset = offset.clone();
            async move {
                let dir = (!p.as_ref().is_empty()).then_some(p);
                let mut stream = match &offset {
                    Some(o) => c.list_with_offset(dir.as_ref(), o),
                    None => c.list(dir.as_ref()),
                };
                let mut out = Vec::new();
                while let Some(meta) = stream.next().await {
                    let meta = meta?;
                    out.push((meta.location.to_string(), meta.size));
                    if out.len() >= limit {
                        break;
                    }
                }
                Ok(out)
            }
        })?;
        Ok(keys
            .into_iter()
            .filter_map(|(k, size)| k.get(strip..).map(|k| ObjectInfo { key: k.to_string(), size }))
            .filter(|i| i.key.starts_with(prefix))
            .collect())
    }

    fn delete(&self, key: &str) -> ObjectResult<()> {
        match self.request(key, |c, p| async move { c.delete(&p).await }) {
            Err(e) if e.kind == ObjectErrorKind::NotFound => Ok(()),
            r => r,
        }
    }
}
