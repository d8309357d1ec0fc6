//! Bounds on `prompt_text` tokenization: how many run at once
//! (`--tokenize-concurrency`) and how much working memory they may claim
//! together (`--tokenize-memory-budget-bytes`). A tokenization claims
//! [`TOKENIZE_BYTES_PER_PROMPT_BYTE`] per prompt byte up front; a lookup that
//! finds no slot or not enough budget fails open at once (`NO_HINT`, counted
//! in `inferencecache_lookup_shed_total{reason}`) instead of queueing: the
//! gateway has a fallback and a routing hint that arrives late is worthless.
//! The claim is returned when the tokenization really ends, even if its
//! lookup already timed out.

use crate::metrics::Metrics;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why a tokenization was not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shed {
    /// Every slot is busy.
    Concurrency,
    /// The memory budget cannot hold this prompt now (or ever).
    Memory,
}

impl Shed {
    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Concurrency => "tokenize_concurrency",
            Self::Memory => "tokenize_memory",
        }
    }
}

/// The shared budget; cheap to clone.
#[derive(Clone)]
pub struct TokenizeBudget {
    slots: Arc<Semaphore>,
    claimed: Arc<AtomicUsize>,
    budget: usize,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for TokenizeBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenizeBudget")
            .field("slots", &self.slots.available_permits())
            .field("claimed", &self.claimed.load(Ordering::Relaxed))
            .field("budget", &self.budget)
            .finish()
    }
}

/// A running tokenization's claim; released on drop.
#[derive(Debug)]
pub struct TokenizePermit {
    _slot: OwnedSemaphorePermit,
    bytes: usize,
    claimed: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

impl Drop for TokenizePermit {
    fn drop(&mut self) {
        self.claimed.fetch_sub(self.bytes, Ordering::AcqRel);
        self.metrics
            .limits
            .tokenize_memory_bytes
            .dec_by(i64::try_from(self.bytes).unwrap_or(i64::MAX));
    }
}

impl TokenizeBudget {
    /// `concurrency` slots (at least 1) sharing `budget` bytes.
    pub fn new(concurrency: usize, budget: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(concurrency.max(1))),
            claimed: Arc::new(AtomicUsize::new(0)),
            budget,
            metrics,
        }
    }

    /// Working memory charged for a prompt of `prompt_bytes` on an encoder
    /// that needs `per_byte` bytes per prompt byte.
    pub fn cost(prompt_bytes: usize, per_byte: usize) -> usize {
        prompt_bytes.saturating_mul(per_byte)
    }

    /// Claims a slot and the prompt's working memory, or says why not (and
    /// counts it).
    pub fn try_acquire(
        &self,
        prompt_bytes: usize,
        per_byte: usize,
    ) -> Result<TokenizePermit, Shed> {
        let r = self.acquire(Self::cost(prompt_bytes, per_byte));
        if let Err(shed) = r {
            self.metrics.limits.shed(shed.label());
        }
        r
    }

    fn acquire(&self, bytes: usize) -> Result<TokenizePermit, Shed> {
        if bytes > self.budget {
            return Err(Shed::Memory);
        }
        let slot = Arc::clone(&self.slots)
            .try_acquire_owned()
            .map_err(|_| Shed::Concurrency)?;
        self.claimed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                cur.checked_add(bytes).filter(|&n| n <= self.budget)
            })
            .map_err(|_| Shed::Memory)?;
        self.metrics
            .limits
            .tokenize_memory_bytes
            .inc_by(i64::try_from(bytes).unwrap_or(i64::MAX));
        Ok(TokenizePermit {
            _slot: slot,
            bytes,
            claimed: Arc::clone(&self.claimed),
            metrics: Arc::clone(&self.metrics),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shed_count(m: &Metrics, reason: &str) -> u64 {
        m.limits
            .shed
            .get_or_create(&crate::limits::LimitLabel {
                reason: reason.into(),
            })
            .get()
    }

    #[test]
    fn slots_and_memory_are_both_enforced_and_returned() {
        let m = Arc::new(Metrics::new());
        const K: usize = crate::limits::TOKENIZE_BYTES_PER_PROMPT_BYTE;
        let per = TokenizeBudget::cost(1000, K);
        let b = TokenizeBudget::new(2, per * 5 / 2, Arc::clone(&m));
        let a1 = b.try_acquire(1000, K).expect("first");
        let a2 = b.try_acquire(1000, K).expect("second");
        assert_eq!(b.try_acquire(1, K).unwrap_err(), Shed::Concurrency);
        drop(a1);
        // One slot free but only one prompt's worth of memory left.
        assert_eq!(b.try_acquire(2000, K).unwrap_err(), Shed::Memory);
        // An HF-encoded prompt of the same size costs more.
        let hf = crate::limits::HF_TOKENIZE_BYTES_PER_PROMPT_BYTE;
        assert_eq!(b.try_acquire(1000, hf).unwrap_err(), Shed::Memory);
        let a3 = b.try_acquire(1000, K).expect("fits");
        assert_eq!(m.limits.tokenize_memory_bytes.get(), 2 * per as i64);
        drop((a2, a3));
        assert_eq!(m.limits.tokenize_memory_bytes.get(), 0);
        // Larger than the whole budget: never admitted.
        assert_eq!(b.try_acquire(4000, K).unwrap_err(), Shed::Memory);
        assert_eq!(shed_count(&m, "tokenize_concurrency"), 1);
        assert_eq!(shed_count(&m, "tokenize_memory"), 3);
    }
}
