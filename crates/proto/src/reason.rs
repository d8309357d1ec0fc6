//! The contract's reason codes (`server.md` §1.4), defined once.
//!
//! On the wire `reason_code` is a string, so that a client treats a code it
//! does not know as "no hint" (the forward-compatibility rule). Inside the
//! system it is this enum: the server decides a [`Reason`], the metrics count
//! by it, the gateway SDK parses into it, and [`Reason::as_str`] is the only
//! place the strings are written.

use std::fmt;

/// Why a LookupRoute, LookupPDRoute or RenderTemplate answered as it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// `PREFIX_MATCH`: the top-ranked replicas hold the request's prefix.
    PrefixMatch,
    /// `TENANT_HOT`: no prefix match; replicas with a recent high hit rate
    /// for the tenant.
    TenantHot,
    /// `AFFINITY_HINT`: no match; a stable seed-derived replica so repeats of
    /// a prefix co-locate.
    AffinityHint,
    /// `NO_HINT`: route as you would without the cache plane.
    NoHint,
    /// `TIMEOUT`: the lookup exceeded the caller's or the tenant's deadline.
    Timeout,
    /// `OK`: RenderTemplate rendered.
    Ok,
    /// `POLICY_REQUIRES_CHAIN`: the tenant's policy requires a block chain
    /// and the request had none.
    PolicyRequiresChain,
    /// `UNKNOWN_TENANT`: the index holds nothing for this tenant.
    UnknownTenant,
    /// `UNKNOWN_MODEL`: the index holds nothing for this (tenant, model).
    UnknownModel,
    /// `UNKNOWN_HASH_SCHEME`: nothing for this (tenant, model, hash_scheme).
    UnknownHashScheme,
    /// `TEMPLATE_NOT_FOUND`: RenderTemplate has no template at the reference.
    TemplateNotFound,
    /// `RENDER_ERROR`: a required slot is missing, a variable is undefined
    /// or the template failed.
    RenderError,
}

impl Reason {
    /// Every code, in declaration order (`ALL[r as usize] == r`).
    pub const ALL: [Reason; 12] = [
        Reason::PrefixMatch,
        Reason::TenantHot,
        Reason::AffinityHint,
        Reason::NoHint,
        Reason::Timeout,
        Reason::Ok,
        Reason::PolicyRequiresChain,
        Reason::UnknownTenant,
        Reason::UnknownModel,
        Reason::UnknownHashScheme,
        Reason::TemplateNotFound,
        Reason::RenderError,
    ];

    /// The wire string.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::PrefixMatch => "PREFIX_MATCH",
            Reason::TenantHot => "TENANT_HOT",
            Reason::AffinityHint => "AFFINITY_HINT",
            Reason::NoHint => "NO_HINT",
            Reason::Timeout => "TIMEOUT",
            Reason::Ok => "OK",
            Reason::PolicyRequiresChain => "POLICY_REQUIRES_CHAIN",
            Reason::UnknownTenant => "UNKNOWN_TENANT",
            Reason::UnknownModel => "UNKNOWN_MODEL",
            Reason::UnknownHashScheme => "UNKNOWN_HASH_SCHEME",
            Reason::TemplateNotFound => "TEMPLATE_NOT_FOUND",
            Reason::RenderError => "RENDER_ERROR",
        }
    }

    /// The code a wire string names; `None` for a code this build does not
    /// know (which a client must treat as no hint).
    pub fn from_wire(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == code)
    }

    /// True for the codes that carry replicas to route to.
    pub const fn is_hint(self) -> bool {
        matches!(
            self,
            Reason::PrefixMatch | Reason::TenantHot | Reason::AffinityHint
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_all_is_indexed_by_discriminant() {
        for (i, r) in Reason::ALL.into_iter().enumerate() {
            assert_eq!(r as usize, i);
            assert_eq!(Reason::from_wire(r.as_str()), Some(r));
        }
    }

    #[test]
    fn the_contract_strings_are_exact() {
        // server.md §1.4, verbatim.
        let wire: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            wire,
            [
                "PREFIX_MATCH",
                "TENANT_HOT",
                "AFFINITY_HINT",
                "NO_HINT",
                "TIMEOUT",
                "OK",
                "POLICY_REQUIRES_CHAIN",
                "UNKNOWN_TENANT",
                "UNKNOWN_MODEL",
                "UNKNOWN_HASH_SCHEME",
                "TEMPLATE_NOT_FOUND",
                "RENDER_ERROR",
            ]
        );
    }

    #[test]
    fn unknown_and_empty_codes_are_not_parsed() {
        assert_eq!(Reason::from_wire(""), None);
        assert_eq!(Reason::from_wire("prefix_match"), None);
        assert_eq!(Reason::from_wire("NEW_CODE_FROM_THE_FUTURE"), None);
    }
}
