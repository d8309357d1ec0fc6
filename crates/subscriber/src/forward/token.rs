//! `--server-token-file`: the bearer token the sidecar presents to a server
//! running `--producer-auth token` (a projected service-account token with
//! audience `inferencecache.io/producer`, docs/security.md).
//!
//! The kubelet rewrites a projected token before it expires, so the file is
//! re-read on every reconnect (a refused token ends in a reconnect, which
//! picks up the new one) and at most every [`REFRESH`] otherwise; every call
//! then carries the current value. Without a file no header is sent.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Longest time a token is used without re-reading the file (projected
/// tokens live ≥ 10 min and are rotated at 80 % of their life).
pub const REFRESH: Duration = Duration::from_secs(60);
/// Largest accepted token file.
pub const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// The client every RPC goes through: the channel plus the bearer header.
pub type ServerClient = InferenceCacheClient<InterceptedService<Channel, BearerToken>>;

#[derive(Debug, Default)]
struct Current {
    header: Option<MetadataValue<Ascii>>,
    read_at: Option<Instant>,
}

/// The token of `--server-token-file`, shared by every clone (the
/// interceptor runs on each call).
#[derive(Debug, Clone, Default)]
pub struct BearerToken {
    file: Option<PathBuf>,
    current: Arc<RwLock<Current>>,
}

impl BearerToken {
    /// A token read from `file` (nothing is read until [`Self::reload`]);
    /// `None` sends no header.
    pub fn new(file: Option<PathBuf>) -> Self {
        Self {
            file,
            current: Arc::default(),
        }
    }

    /// Whether a token file is configured.
    pub fn is_configured(&self) -> bool {
        self.file.is_some()
    }

    /// Re-reads the file. On failure the previous token stays in use (it may
    /// still be valid) and the error says why.
    pub fn reload(&self) -> Result<(), String> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let result = read_header(path);
        let mut cur = match self.current.write() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        cur.read_at = Some(Instant::now());
        cur.header = Some(result?);
        Ok(())
    }

    /// Re-reads the file if the last read is older than [`REFRESH`].
    pub fn refresh_if_stale(&self) -> Result<(), String> {
        let stale = match self.current.read() {
            Ok(c) => c.read_at.is_none_or(|t| t.elapsed() >= REFRESH),
            Err(_) => true,
        };
        if stale { self.reload() } else { Ok(()) }
    }

    fn header(&self) -> Option<MetadataValue<Ascii>> {
        match self.current.read() {
            Ok(c) => c.header.clone(),
            Err(p) => p.into_inner().header.clone(),
        }
    }
}

fn read_header(path: &PathBuf) -> Result<MetadataValue<Ascii>, String> {
    let shown = path.display();
    let len = std::fs::metadata(path)
        .map_err(|e| format!("--server-token-file {shown}: {e}"))?
        .len();
    if len > MAX_TOKEN_BYTES {
        return Err(format!(
            "--server-token-file {shown}: {len} bytes is not a token (limit {MAX_TOKEN_BYTES})"
        ));
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--server-token-file {shown}: {e}"))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("--server-token-file {shown} is empty"));
    }
    format!("Bearer {token}")
        .parse()
        .map_err(|_| format!("--server-token-file {shown}: not a printable ASCII token"))
}

impl Interceptor for BearerToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(h) = self.header() {
            req.metadata_mut().insert("authorization", h);
        }
        Ok(req)
    }
}

/// The client over `channel` with `token`.
pub fn client(channel: Channel, token: BearerToken) -> ServerClient {
    InferenceCacheClient::with_interceptor(channel, token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_follows_the_file_and_survives_a_bad_rewrite() {
        let dir = std::env::temp_dir().join(format!("ic-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let path = dir.join("token");
        std::fs::write(&path, "abc\n").unwrap_or_default();
        let t = BearerToken::new(Some(path.clone()));
        assert!(t.header().is_none(), "nothing read before reload");
        assert_eq!(t.reload(), Ok(()));
        let mut i = t.clone();
        let req = i
            .call(tonic::Request::new(()))
            .unwrap_or_else(|_| unreachable!());
        assert_eq!(
            req.metadata().get("authorization").map(|v| v.to_str().ok()),
            Some(Some("Bearer abc"))
        );
        std::fs::write(&path, "def").unwrap_or_default();
        assert_eq!(t.refresh_if_stale(), Ok(()), "fresh: not re-read");
        assert_eq!(
            t.header()
                .map(|v| v.to_str().map(str::to_owned).unwrap_or_default()),
            Some("Bearer abc".into())
        );
        assert_eq!(t.reload(), Ok(()));
        assert_eq!(
            t.header()
                .map(|v| v.to_str().map(str::to_owned).unwrap_or_default()),
            Some("Bearer def".into()),
            "clones share the new token"
        );
        std::fs::write(&path, "  \n").unwrap_or_default();
        assert!(t.reload().is_err());
        assert!(t.header().is_some(), "last good token kept");
        let none = BearerToken::new(None);
        assert_eq!(none.reload(), Ok(()));
        assert!(none.header().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
