//! The engines behind the gateway: what each serves, whether it is healthy,
//! and the gateway's own load signal for it.
//!
//! The load signal is exact for the traffic the gateway routes: requests in
//! flight, and prompt tokens the engine still has to prefill (each request's
//! uncached tokens, counted from dispatch until its first output byte). An
//! engine's own `/metrics` lag by a scrape interval; these counters move
//! with every request.

use crate::config::EngineSpec;
use crate::foresight::Foresight;
use crate::pending::Pending;
use crate::progress::Progress;
use inferencecache_subscriber::sequence::CaughtUpSignal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// What an engine serves: base models and LoRA adapters (`GET /v1/models`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    /// Base model names (`parent` null).
    pub models: Vec<String>,
    /// LoRA adapter name → its base model.
    pub adapters: Vec<(String, String)>,
}

impl Served {
    /// Parses a `/v1/models` answer.
    pub fn from_models_json(v: &serde_json::Value) -> Self {
        let mut out = Self::default();
        for m in v["data"].as_array().into_iter().flatten() {
            let Some(id) = m["id"].as_str() else { continue };
            match m["parent"].as_str() {
                Some(parent) if parent != id => {
                    out.adapters.push((id.to_owned(), parent.to_owned()));
                }
                _ => out.models.push(id.to_owned()),
            }
        }
        out
    }

    /// The (index model, adapter) of a request's `model`: a base model is
    /// itself with no adapter, a LoRA name is its base with the adapter.
    ///
    /// An engine has one KV cache whatever name its model is served under,
    /// and its subscriber reports it under the first name, so every alias
    /// (`--served-model-name a b`) resolves to that one.
    pub fn resolve(&self, model: &str) -> Option<(&str, &str)> {
        let canonical = |m: &str| -> Option<&str> {
            self.models
                .iter()
                .any(|x| x == m)
                .then(|| self.models.first().map(String::as_str))
                .flatten()
        };
        if let Some(m) = canonical(model) {
            return Some((m, ""));
        }
        self.adapters
            .iter()
            .find(|(a, _)| a == model)
            .map(|(a, base)| (canonical(base).unwrap_or(base.as_str()), a.as_str()))
    }

    /// The index model id: the first base model.
    pub fn index_model(&self) -> Option<&str> {
        self.models.first().map(String::as_str)
    }
}

/// One engine and its live state.
#[derive(Debug)]
pub struct Engine {
    /// Its settings.
    pub spec: EngineSpec,
    /// The replica id (`spec.id`, shared for cheap comparisons with hints).
    pub id: Arc<str>,
    healthy: AtomicBool,
    in_flight: AtomicU64,
    pending_prefill: AtomicU64,
    /// Uncached prompt tokens sent here since the gateway started (or, for
    /// an engine added later, since it joined at the fleet's minimum): what
    /// its prefix cache has had to take in. Equal-sized LRU caches that take
    /// in content at the same rate keep it equally long, so new prefixes go
    /// where less went before ([`crate::pick`]'s tie-break).
    fresh_tokens: AtomicU64,
    served: RwLock<Served>,
    /// Block chains routed here and not yet confirmed by the index.
    pub pending: Pending,
    /// The model of its block pool: which held blocks the requests sent
    /// here will evict ([`crate::foresight`]).
    pub foresight: Foresight,
    /// Its prefills in flight and how far along they are
    /// ([`crate::progress`]).
    pub progress: Progress,
    /// What its answers said (the status page).
    pub stats: Stats,
    /// Set once the index has its event history (the subscriber's first
    /// replay applied and acknowledged, or the wait for it given up, or no
    /// in-process index): until then the index may still list blocks the
    /// engine has since dropped, and its claims for this engine are ignored.
    pub indexed: CaughtUpSignal,
    /// Cancelled when it is removed (or the gateway stops): ends its
    /// attach loop and its KV-event subscriber.
    retired: CancellationToken,
}

/// Per-engine totals for the status page (the same facts as the metrics,
/// kept where a page can read them without parsing an exposition).
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests sent to it.
    pub requests: AtomicU64,
    /// Answers whose usage was read.
    pub answered: AtomicU64,
    /// Prompt tokens of those answers.
    pub prompt_tokens: AtomicU64,
    /// Of which the engine served from cache.
    pub cached_tokens: AtomicU64,
    /// Answers whose cached tokens equal what the gateway expected.
    pub hint_exact: AtomicU64,
    /// ... were fewer (the hint over-claimed).
    pub hint_over: AtomicU64,
    /// ... were more (the hint under-claimed).
    pub hint_under: AtomicU64,
    /// Expected reuse summed over checked answers.
    pub expected_tokens: AtomicU64,
    /// First-byte times (microseconds) summed, and their count.
    pub ttft_us_sum: AtomicU64,
    /// Count of first-byte times.
    pub ttft_count: AtomicU64,
}

impl Stats {
    /// Records one answer's usage against the expected reuse.
    pub fn usage(&self, prompt: u64, cached: Option<u64>, expected: u64) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens.fetch_add(prompt, Ordering::Relaxed);
        let Some(c) = cached else { return };
        self.cached_tokens.fetch_add(c, Ordering::Relaxed);
        self.expected_tokens.fetch_add(expected, Ordering::Relaxed);
        let which = match c.cmp(&expected) {
            std::cmp::Ordering::Equal => &self.hint_exact,
            std::cmp::Ordering::Less => &self.hint_over,
            std::cmp::Ordering::Greater => &self.hint_under,
        };
        which.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a first-byte time.
    pub fn first_byte(&self, seconds: f64) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let us = (seconds * 1e6) as u64;
        self.ttft_us_sum.fetch_add(us, Ordering::Relaxed);
        self.ttft_count.fetch_add(1, Ordering::Relaxed);
    }
}

impl Engine {
    /// A new engine, healthy until a check says otherwise.
    pub fn new(spec: EngineSpec, served: Served) -> Self {
        Self::under(spec, served, &CancellationToken::new())
    }

    /// A new engine whose tasks also end when `parent` is cancelled.
    pub fn under(spec: EngineSpec, served: Served, parent: &CancellationToken) -> Self {
        Self {
            retired: parent.child_token(),
            id: Arc::from(spec.id.as_str()),
            spec,
            healthy: AtomicBool::new(true),
            in_flight: AtomicU64::new(0),
            pending_prefill: AtomicU64::new(0),
            fresh_tokens: AtomicU64::new(0),
            served: RwLock::new(served),
            pending: Pending::default(),
            foresight: Foresight::default(),
            progress: Progress::default(),
            stats: Stats::default(),
            indexed: CaughtUpSignal::new(),
        }
    }

    /// Its tasks' cancellation (attach loop, subscriber).
    pub fn retired(&self) -> &CancellationToken {
        &self.retired
    }

    /// Removed from the gateway: stop its subscriber; requests already on
    /// it finish.
    pub fn retire(&self) {
        self.retired.cancel();
    }

    /// Whether the last health check (or request) found it up.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Records a health outcome; true when it changed.
    pub fn set_healthy(&self, up: bool) -> bool {
        self.healthy.swap(up, Ordering::Relaxed) != up
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Prompt tokens dispatched and not yet prefilled.
    pub fn pending_prefill(&self) -> u64 {
        self.pending_prefill.load(Ordering::Relaxed)
    }

    /// Prompt tokens still to prefill at `at`, by the engine's learned
    /// prefill rate ([`crate::progress`]; blocks of `block` tokens).
    pub fn prefill_left(&self, at: Instant, block: u64) -> u64 {
        self.progress.left(at, block)
    }

    /// Uncached prompt tokens sent here (see the field's docs).
    pub fn fresh_tokens(&self) -> u64 {
        self.fresh_tokens.load(Ordering::Relaxed)
    }

    /// What it serves.
    pub fn served(&self) -> Served {
        self.served.read().map(|s| s.clone()).unwrap_or_default()
    }

    /// Replaces what it serves (after a `/v1/models` refresh).
    pub fn set_served(&self, served: Served) {
        if let Ok(mut s) = self.served.write() {
            *s = served;
        }
    }

    /// The (index model, adapter) of `model` on this engine, if it serves it.
    pub fn resolve(&self, model: &str) -> Option<(String, String)> {
        let s = self.served.read().ok()?;
        s.resolve(model).map(|(m, a)| (m.to_owned(), a.to_owned()))
    }

    /// Counts a dispatched request until the returned guard is dropped;
    /// `uncached` prompt tokens count as pending prefill until
    /// [`Dispatch::prefilled`].
    pub fn dispatch(self: &Arc<Self>, uncached: u64) -> Dispatch {
        self.dispatch_chain(uncached, &[])
    }

    /// [`Engine::dispatch`], also holding the prompt's block `chain` as
    /// routed here ([`Pending`]) until the index can say it.
    pub fn dispatch_chain(self: &Arc<Self>, uncached: u64, chain: &[u64]) -> Dispatch {
        self.dispatch_prompt(uncached, chain, 0)
    }

    /// [`Engine::dispatch_chain`] for a `prompt_tokens`-token prompt, also
    /// queued in the engine's [`Foresight`] (0: length unknown, not
    /// modelled).
    pub fn dispatch_prompt(
        self: &Arc<Self>,
        uncached: u64,
        chain: &[u64],
        prompt_tokens: u64,
    ) -> Dispatch {
        self.dispatch_at(uncached, chain, prompt_tokens, Instant::now())
    }

    /// [`Engine::dispatch_prompt`], sent at `at` (tests run a clock of
    /// their own).
    pub fn dispatch_at(
        self: &Arc<Self>,
        uncached: u64,
        chain: &[u64],
        prompt_tokens: u64,
        at: Instant,
    ) -> Dispatch {
        static REQUESTS: AtomicU64 = AtomicU64::new(1);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.pending_prefill.fetch_add(uncached, Ordering::Relaxed);
        self.fresh_tokens.fetch_add(uncached, Ordering::Relaxed);
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let seq = REQUESTS.fetch_add(1, Ordering::Relaxed);
        self.progress.dispatched(seq, uncached, at);
        let owner = if chain.is_empty() {
            0
        } else {
            self.pending.insert(seq, chain, at);
            if prompt_tokens > 0 {
                self.foresight.dispatched(seq, chain, prompt_tokens);
            }
            seq
        };
        LOAD_CHANGED.notify_waiters();
        Dispatch {
            engine: Arc::clone(self),
            pending: uncached,
            seq,
            owner,
            prefilled: false,
        }
    }
}

/// Woken whenever an engine's requests in flight or pending prefill
/// change (dispatch, first byte, end), for whoever reports them
/// (`caller_load.rs`) instead of polling. Process-wide: a waiter rereads
/// the counts it cares about.
pub(crate) static LOAD_CHANGED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// The engines behind the gateway right now: a snapshot per request, so
/// engines come and go (the admin endpoints) without a lock on the request
/// path beyond one read.
#[derive(Debug, Default)]
pub struct EngineSet {
    list: RwLock<Arc<Vec<Arc<Engine>>>>,
}

impl EngineSet {
    /// A set of `engines`.
    pub fn new(engines: Vec<Arc<Engine>>) -> Self {
        Self {
            list: RwLock::new(Arc::new(engines)),
        }
    }

    /// The engines now.
    pub fn snapshot(&self) -> Arc<Vec<Arc<Engine>>> {
        self.list.read().map(|l| Arc::clone(&l)).unwrap_or_default()
    }

    /// Adds `engine`; `Err` with the engine already there under its id.
    pub fn add(&self, engine: Arc<Engine>) -> Result<(), Arc<Engine>> {
        let Ok(mut l) = self.list.write() else {
            return Err(engine);
        };
        if let Some(e) = l.iter().find(|e| e.id == engine.id) {
            return Err(Arc::clone(e));
        }
        // A newcomer joins at the fleet's least-filled level, so it takes
        // its share of new prefixes, not all of them until it catches up.
        let floor = l.iter().map(|e| e.fresh_tokens()).min().unwrap_or(0);
        engine.fresh_tokens.fetch_max(floor, Ordering::Relaxed);
        let mut next = l.as_ref().clone();
        next.push(engine);
        *l = Arc::new(next);
        Ok(())
    }

    /// Removes the engine `id` (and retires it).
    pub fn remove(&self, id: &str) -> Option<Arc<Engine>> {
        let mut l = self.list.write().ok()?;
        let i = l.iter().position(|e| e.id.as_ref() == id)?;
        let mut next = l.as_ref().clone();
        let gone = next.remove(i);
        *l = Arc::new(next);
        gone.retire();
        Some(gone)
    }
}

/// One request's share of an engine's load; released on drop, so an
/// abandoned or failed request never leaks load.
#[derive(Debug)]
pub struct Dispatch {
    engine: Arc<Engine>,
    pending: u64,
    /// The request's number ([`Progress`]).
    seq: u64,
    /// Its entries in the engine's [`Pending`] (0: none).
    owner: u64,
    prefilled: bool,
}

impl Dispatch {
    /// The engine.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The prompt is prefilled (first output arrived): its tokens no longer
    /// wait.
    pub fn prefilled(&mut self) {
        self.prefilled_at(Instant::now());
    }

    /// [`Dispatch::prefilled`], the first output having come at `at`.
    pub fn prefilled_at(&mut self, at: Instant) {
        if std::mem::replace(&mut self.prefilled, true) {
            return;
        }
        self.release_prefill();
        self.engine.progress.first_token(self.seq, at);
        if self.owner != 0 {
            self.engine.pending.confirm(self.owner, at);
            self.engine.foresight.scheduled(self.owner);
        }
    }

    /// Whether [`Dispatch::prefilled`] was called.
    pub fn is_prefilled(&self) -> bool {
        self.prefilled
    }

    fn release_prefill(&mut self) {
        let n = std::mem::take(&mut self.pending);
        if n > 0 {
            self.engine.pending_prefill.fetch_sub(n, Ordering::Relaxed);
            LOAD_CHANGED.notify_waiters();
        }
    }
}

impl Drop for Dispatch {
    fn drop(&mut self) {
        if !self.prefilled {
            // Never got a byte: nothing of it reached the engine's cache.
            let n = self.pending;
            let _ =
                self.engine
                    .fresh_tokens
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| {
                        Some(f.saturating_sub(n))
                    });
        }
        self.release_prefill();
        if !self.prefilled {
            self.engine.progress.abandoned(self.seq);
        }
        if !self.prefilled && self.owner != 0 {
            // Never got a byte: the engine may not hold the prefix at all.
            self.engine.pending.release(self.owner);
        }
        if self.owner != 0 {
            self.engine.foresight.finished(self.owner);
        }
        self.engine.in_flight.fetch_sub(1, Ordering::Relaxed);
        LOAD_CHANGED.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_json_splits_bases_and_adapters() {
        let v = serde_json::json!({"data": [
            {"id": "tiny", "parent": null},
            {"id": "alias", "parent": null},
            {"id": "tiny-lora", "parent": "tiny"},
        ]});
        let s = Served::from_models_json(&v);
        assert_eq!(s.resolve("tiny"), Some(("tiny", "")));
        assert_eq!(s.resolve("tiny-lora"), Some(("tiny", "tiny-lora")));
        assert_eq!(s.resolve("alias"), Some(("tiny", "")));
        assert_eq!(s.resolve("other"), None);
    }

    #[test]
    fn engines_come_and_go() {
        let set = EngineSet::default();
        let e = |u: &str| {
            Arc::new(Engine::new(
                EngineSpec::parse(u).unwrap(),
                Served::default(),
            ))
        };
        set.add(e("http://a:1")).unwrap();
        let before = set.snapshot();
        set.add(e("http://b:1")).unwrap();
        assert!(set.add(e("http://b:1")).is_err(), "one engine per id");
        assert_eq!((before.len(), set.snapshot().len()), (1, 2));
        let gone = set.remove("b:1").unwrap();
        assert!(gone.retired().is_cancelled());
        assert!(set.remove("b:1").is_none());
        assert_eq!(set.snapshot().len(), 1);
    }

    #[test]
    fn dispatch_counts_and_releases() {
        let spec = EngineSpec::parse("http://h:1").unwrap();
        let e = Arc::new(Engine::new(spec, Served::default()));
        let mut d = e.dispatch(100);
        assert_eq!((e.in_flight(), e.pending_prefill()), (1, 100));
        d.prefilled();
        assert_eq!((e.in_flight(), e.pending_prefill()), (1, 0));
        let d2 = e.dispatch(50);
        drop(d);
        drop(d2);
        assert_eq!((e.in_flight(), e.pending_prefill()), (0, 0));
    }
}
