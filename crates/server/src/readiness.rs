//! Named readiness blockers: `/readyz` answers 503 with the first blocker's
//! reason while any is set (e.g. "bus: catching up, applied 120 of 5000").
//! Subsystems set and clear their own key; the listeners' own ready flag is
//! checked after these.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Shared set of readiness blockers (cheap to clone).
#[derive(Debug, Clone, Default)]
pub(crate) struct Readiness {
    blockers: Arc<Mutex<BTreeMap<&'static str, String>>>,
}

impl Readiness {
    /// Sets (or updates) the blocker `key`.
    pub(crate) fn block(&self, key: &'static str, reason: impl Into<String>) {
        let mut g = self.blockers.lock().unwrap_or_else(|e| e.into_inner());
        g.insert(key, reason.into());
    }

    /// Clears the blocker `key`.
    pub(crate) fn clear(&self, key: &'static str) {
        let mut g = self.blockers.lock().unwrap_or_else(|e| e.into_inner());
        g.remove(key);
    }

    /// `"key: reason"` of the first blocker, if any.
    pub(crate) fn reason(&self) -> Option<String> {
        let g = self.blockers.lock().unwrap_or_else(|e| e.into_inner());
        g.iter().next().map(|(k, r)| format!("{k}: {r}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blockers_name_the_reason_until_cleared() {
        let r = Readiness::default();
        assert_eq!(r.reason(), None);
        r.block("bus", "catching up");
        assert_eq!(r.reason().as_deref(), Some("bus: catching up"));
        r.block("bus", "applied 3 of 5");
        assert_eq!(r.reason().as_deref(), Some("bus: applied 3 of 5"));
        r.clear("bus");
        assert_eq!(r.reason(), None);
    }
}
