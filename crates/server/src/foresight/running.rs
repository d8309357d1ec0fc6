//! The requests that may be running past the last load report: the blocks
//! they hold or are about to take are not blank.
//!
//! The sidecar's load report (scraped every second, sent after the scrape)
//! says how many requests ran then; requests that started since take blocks
//! the report cannot show. Each holds its partial last block, and one
//! whose prompt fills its last block exactly takes a new block at its first
//! decode step (vLLM allocates the first generated token's slot then, not
//! at the prefill), evicting one when none is blank. The model counted
//! neither: issue 33's 4-client `after` over-claims of session 48's run B1
//! were both one block, the first with one request running that the model
//! took for the one queued (its partial block counted blank), the second a
//! block-aligned request's first decode block. The server sees starts, not
//! ends, so every start since the report's scrape counts as running (the
//! starts of requests it hinted: traffic it did not hint is counted by the
//! next report only, as before).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Most starts remembered (past this the oldest go: a report that never
/// comes must not grow the model).
const MAX_STARTS: usize = 256;

/// Starts since the last load report's scrape.
#[derive(Debug, Default)]
pub(crate) struct Running {
    /// (when, whether its prompt fills its last block), oldest first.
    starts: VecDeque<(Instant, bool)>,
}

impl Running {
    /// A request started (its blocks were reported stored): `aligned` when
    /// its prompt is a whole number of blocks.
    pub(crate) fn started(&mut self, at: Instant, aligned: bool) {
        if self.starts.len() >= MAX_STARTS {
            self.starts.pop_front();
        }
        self.starts.push_back((at, aligned));
    }

    /// A load report arrived at `at`, scraped at most `grace` before: the
    /// starts before the scrape are in its counts.
    pub(crate) fn reported(&mut self, at: Instant, grace: Duration) {
        let scrape = at.checked_sub(grace);
        while self
            .starts
            .front()
            .is_some_and(|s| scrape.is_some_and(|t| s.0 < t))
        {
            self.starts.pop_front();
        }
    }

    /// Starts the last report may not count: (holding a partial block,
    /// about to take a decode block).
    pub(crate) fn unreported(&self) -> (usize, usize) {
        let aligned = self.starts.iter().filter(|s| s.1).count();
        (self.starts.len() - aligned, aligned)
    }

    pub(crate) fn clear(&mut self) {
        self.starts.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_counts_the_starts_before_its_scrape() {
        let t0 = Instant::now();
        let mut r = Running::default();
        r.started(t0, false);
        r.started(t0 + Duration::from_millis(900), true);
        r.started(t0 + Duration::from_millis(1500), false);
        assert_eq!(r.unreported(), (2, 1));
        r.reported(t0 + Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(r.unreported(), (1, 0));
    }
}
