//! HTTP to the server's control listener (`:8081`): JSON pushes and the
//! `/snapshot` read, each with a bearer token re-read from its projected
//! file on every request (kubelet rotates the file; a missing file means an
//! unauthenticated request, for servers run with `--insecure-disable-auth`).

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The reference's client timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest response body read (a `/snapshot` of a large cluster is a few
/// MiB; a runaway body must not exhaust memory).
pub const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// Why a request to the server failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Connect, timeout or transfer failure: retried.
    #[error("{url}: {source}")]
    Transport {
        /// The URL.
        url: String,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with a non-success status.
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
        /// The start of the response body (the server's reason).
        body: String,
    },
    /// The token file exists but cannot be read.
    #[error("read token {path}: {source}")]
    Token {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The request or response body is not the expected JSON.
    #[error("{url}: {message}")]
    Body {
        /// The URL.
        url: String,
        /// What was wrong.
        message: String,
    },
}

impl ClientError {
    /// The HTTP status, when the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// A metric label for the outcome.
    pub fn result_label(&self) -> &'static str {
        match self.status() {
            Some(404) => "unsupported",
            Some(s) if (400..500).contains(&s) => "rejected",
            _ => "error",
        }
    }
}

/// Reads a bearer token; `None` when the file does not exist or is empty.
pub fn read_token(path: &Path) -> Result<Option<String>, ClientError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s.trim().to_owned()).filter(|t| !t.is_empty())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ClientError::Token {
            path: path.to_owned(),
            source,
        }),
    }
}

/// A client for one server.
#[derive(Debug, Clone)]
pub struct ServerClient {
    http: reqwest::Client,
}

impl Default for ServerClient {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerClient {
    /// A client with the reference's 5 s timeout.
    pub fn new() -> Self {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Self { http }
    }

    fn auth(
        req: reqwest::RequestBuilder,
        token_file: &Path,
    ) -> Result<reqwest::RequestBuilder, ClientError> {
        Ok(match read_token(token_file)? {
            Some(t) => req.bearer_auth(t),
            None => req,
        })
    }

    async fn finish(url: &str, mut resp: reqwest::Response) -> Result<Vec<u8>, ClientError> {
        let status = resp.status().as_u16();
        let too_large = || ClientError::Body {
            url: url.to_owned(),
            message: format!("response larger than {MAX_RESPONSE_BYTES} bytes"),
        };
        if resp
            .content_length()
            .is_some_and(|n| n > MAX_RESPONSE_BYTES as u64)
        {
            return Err(too_large());
        }
        // Chunk by chunk, so a body without a length is bounded too.
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|source| ClientError::Transport {
                url: url.to_owned(),
                source,
            })?
        {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        if !(200..300).contains(&status) {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)])
                .trim()
                .to_owned();
            return Err(ClientError::Status {
                url: url.to_owned(),
                status,
                body: text,
            });
        }
        Ok(body)
    }

    /// POSTs `body` as JSON; success is any 2xx (the server answers 204).
    pub async fn push<T: Serialize>(
        &self,
        url: &str,
        token_file: &Path,
        body: &T,
    ) -> Result<(), ClientError> {
        let json = serde_json::to_vec(body).map_err(|e| ClientError::Body {
            url: url.to_owned(),
            message: e.to_string(),
        })?;
        let req = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .body(json);
        let resp = Self::auth(req, token_file)?
            .send()
            .await
            .map_err(|source| ClientError::Transport {
                url: url.to_owned(),
                source,
            })?;
        Self::finish(url, resp).await.map(drop)
    }

    /// GETs JSON; only a 200 is accepted.
    pub async fn get_json<T: DeserializeOwned>(
        &self,
        url: &str,
        token_file: &Path,
    ) -> Result<T, ClientError> {
        let resp = Self::auth(self.http.get(url), token_file)?
            .send()
            .await
            .map_err(|source| ClientError::Transport {
                url: url.to_owned(),
                source,
            })?;
        if resp.status().as_u16() != 200 && resp.status().is_success() {
            return Err(ClientError::Status {
                url: url.to_owned(),
                status: resp.status().as_u16(),
                body: String::new(),
            });
        }
        let body = Self::finish(url, resp).await?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Body {
            url: url.to_owned(),
            message: format!("decode: {e}"),
        })
    }
}
