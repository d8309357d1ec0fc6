//! The bearer-token flags of the tools that call the control listener
//! (`snapshot`, `doctor`): one definition, one way to read them.

use clap::Args;
use std::path::PathBuf;

/// `--token` / `--token-file`.
#[derive(Debug, Clone, Args)]
pub(crate) struct TokenArgs {
    /// Bearer token for the control listener (TokenReview mode).
    #[arg(
        long,
        env = "INFERENCECACHE_TOKEN",
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    token: Option<String>,

    /// File holding the bearer token (e.g. a projected service-account token).
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
}

impl TokenArgs {
    /// The token, trimmed; from the file when one is given.
    pub(crate) fn resolve(&self) -> Result<Option<String>, String> {
        if let Some(path) = &self.token_file {
            let t = std::fs::read_to_string(path)
                .map_err(|e| format!("--token-file {}: {e}", path.display()))?;
            return Ok(Some(t.trim().to_owned()));
        }
        Ok(self.token.as_ref().map(|t| t.trim().to_owned()))
    }
}
