//! Routing without a (usable) hint: round-robin over the gateway's replicas.

use crate::hint::Hint;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Round-robin fallback that follows a hint when it can.
///
/// ```
/// use inferencecache_client::{Hint, NoHintReason, RoundRobin};
/// let rr = RoundRobin::new();
/// let replicas = vec!["a".to_string(), "b".to_string()];
/// let none = Hint::NoHint(NoHintReason::NoHint);
/// assert_eq!(rr.pick(&none, &replicas), "a");
/// assert_eq!(rr.pick(&none, &replicas), "b");
/// ```
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl RoundRobin {
    /// Starts at the first replica.
    pub fn new() -> Self {
        Self::default()
    }

    /// The hint's best candidate when it is one of `replicas` (a hint may
    /// name a replica the gateway has since removed); otherwise the next
    /// replica in turn. Returns `""` only when `replicas` is empty.
    pub fn pick<'a>(&self, hint: &'a Hint, replicas: &'a [String]) -> &'a str {
        if let Some(best) = hint.best() {
            if let Some(known) = replicas.iter().find(|r| **r == best.replica_id) {
                return known;
            }
        }
        if replicas.is_empty() {
            return "";
        }
        // Relaxed: the counter only spreads load; no ordering with other memory.
        let i = self.next.fetch_add(1, Ordering::Relaxed) % replicas.len();
        &replicas[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hint::{Candidate, NoHintReason, Tier};

    fn hint(replica: &str) -> Hint {
        Hint::PrefixMatch(vec![Candidate {
            replica_id: replica.into(),
            score: 1.0,
            matched_tokens: 64,
            hit_probability: 1.0,
            tier: Tier::T1,
        }])
    }

    #[test]
    fn follows_known_hints_and_round_robins_otherwise() {
        let rr = RoundRobin::new();
        let replicas: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        assert_eq!(rr.pick(&hint("c"), &replicas), "c");
        assert_eq!(
            rr.pick(&hint("c"), &replicas),
            "c",
            "hints do not advance the turn"
        );
        let none = Hint::NoHint(NoHintReason::Unavailable);
        let turns: Vec<&str> = (0..4).map(|_| rr.pick(&none, &replicas)).collect();
        assert_eq!(turns, ["a", "b", "c", "a"]);
        assert_eq!(
            rr.pick(&hint("gone"), &replicas),
            "b",
            "unknown replica → next turn"
        );
        assert_eq!(rr.pick(&none, &[]), "");
    }
}
