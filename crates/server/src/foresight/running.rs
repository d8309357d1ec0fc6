//! Block-aligned requests started since the last load report: each takes
//! a block at its first decode step that no report has shown yet.
//!
//! vLLM allocates the slot of a request's first generated token at its
//! first decode step, not at the prefill; a prompt that fills its last
//! block exactly then takes a new block, evicting the oldest free one when
//! none is blank, with nothing queued. One of the two 4-client `after`
//! over-claims of session 48's run B1 was such a block (a 1,632-token
//! prompt: 51 x 32). The server sees starts, not ends or decode steps, so
//! each such start since the last report's scrape counts as a pending
//! one-block allocation; the next report's counts include it. Only starts
//! of requests this server hinted are known (their prompt length).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Most starts remembered (past this the oldest go: a report that never
/// comes must not grow the model).
const MAX_STARTS: usize = 256;

/// Block-aligned starts since the last load report's scrape.
#[derive(Debug, Default)]
pub(crate) struct Running {
    /// When each started, oldest first.
    starts: VecDeque<Instant>,
}

impl Running {
    /// A request started (its blocks were reported stored): `aligned` when
    /// its prompt is a whole number of blocks.
    pub(crate) fn started(&mut self, at: Instant, aligned: bool) {
        if !aligned {
            return;
        }
        if self.starts.len() >= MAX_STARTS {
            self.starts.pop_front();
        }
        self.starts.push_back(at);
    }

    /// A load report arrived at `at`, scraped at most `grace` before: the
    /// starts before the scrape are in its counts.
    pub(crate) fn reported(&mut self, at: Instant, grace: Duration) {
        let Some(scrape) = at.checked_sub(grace) else {
            return;
        };
        while self.starts.front().is_some_and(|s| *s < scrape) {
            self.starts.pop_front();
        }
    }

    /// Decode blocks the last report may not count.
    pub(crate) fn pending(&self) -> usize {
        self.starts.len()
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
        assert_eq!(r.pending(), 1);
        r.reported(t0 + Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(r.pending(), 0);
        r.started(t0 + Duration::from_millis(2500), true);
        assert_eq!(r.pending(), 1);
    }
}
