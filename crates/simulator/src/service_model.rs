//! The service-time model that turns routing decisions into time to first
//! token.
//!
//! Each replica prefills one request at a time, first come first served (a
//! long prefill saturates the GPU, so queued prefills wait), and decodes in a
//! continuous batch: a request's decode runs alongside the others and only
//! keeps the request in flight (it counts towards the queue depth and
//! pressure) without delaying other prefills. So
//!
//! ```text
//! TTFT   = wait for the replica's prefill queue
//!        + prefill_overhead + prefill_per_token × uncached prompt tokens
//! finish = first token + decode_per_token × output tokens
//! ```
//!
//! Defaults are roughly an 8B dense model on one H100-class GPU with long
//! prompts: ~20k prefill tokens/s (50 µs/token), ~12 ms per decode step, and
//! 5 ms of scheduling and first-step overhead. They are inputs, not
//! measurements: change them to match your engine.

use serde::{Deserialize, Serialize};

/// Service-time constants, all in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ServiceModel {
    /// Fixed cost of every prefill.
    pub prefill_overhead_us: f64,
    /// Cost per prompt token that is not already cached.
    pub prefill_us_per_token: f64,
    /// Time per generated token.
    pub decode_us_per_token: f64,
}

impl Default for ServiceModel {
    fn default() -> Self {
        Self {
            prefill_overhead_us: 5_000.0,
            prefill_us_per_token: 50.0,
            decode_us_per_token: 12_000.0,
        }
    }
}

impl ServiceModel {
    /// Prefill time for `uncached` tokens. At least one token is always
    /// computed (an engine recomputes the last prompt token even on a full
    /// hit to produce logits).
    pub fn prefill_us(&self, uncached: u32) -> u64 {
        (self.prefill_overhead_us + self.prefill_us_per_token * f64::from(uncached.max(1))).round()
            as u64
    }

    /// Decode time for `output` tokens (the first one comes with the prefill).
    pub fn decode_us(&self, output: u32) -> u64 {
        (self.decode_us_per_token * f64::from(output.saturating_sub(1))).round() as u64
    }
}
