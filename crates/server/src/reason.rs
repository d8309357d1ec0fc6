//! Reason-code strings of the contract (`server.md` §1.4). They are strings on
//! the wire so that clients treat any code they do not know as "no hint".

/// The top-ranked replicas hold the request's prefix.
pub const PREFIX_MATCH: &str = "PREFIX_MATCH";
/// No prefix match; replicas with a recent high hit rate for the tenant.
pub const TENANT_HOT: &str = "TENANT_HOT";
/// No match; a stable seed-derived replica so repeats of a prefix co-locate.
pub const AFFINITY_HINT: &str = "AFFINITY_HINT";
/// No hint.
pub const NO_HINT: &str = "NO_HINT";
/// The lookup exceeded the caller's or the tenant's deadline.
pub const TIMEOUT: &str = "TIMEOUT";
/// RenderTemplate success.
pub const OK: &str = "OK";
/// The tenant's policy requires a block chain and the request had none.
pub const POLICY_REQUIRES_CHAIN: &str = "POLICY_REQUIRES_CHAIN";
/// The index holds nothing for this tenant.
pub const UNKNOWN_TENANT: &str = "UNKNOWN_TENANT";
/// The index holds nothing for this (tenant, model).
pub const UNKNOWN_MODEL: &str = "UNKNOWN_MODEL";
/// The index holds nothing for this (tenant, model, hash_scheme).
pub const UNKNOWN_HASH_SCHEME: &str = "UNKNOWN_HASH_SCHEME";
/// RenderTemplate: no template at `template_ref`.
pub const TEMPLATE_NOT_FOUND: &str = "TEMPLATE_NOT_FOUND";
/// RenderTemplate: a required slot is missing, a variable is undefined or the
/// template failed.
pub const RENDER_ERROR: &str = "RENDER_ERROR";
