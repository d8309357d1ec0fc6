//! Per-publisher ZMQ sequence tracking as a pure state machine.
//!
//! The engine numbers every published batch (`seq`, 8-byte big-endian, from 0
//! per publisher process) and keeps the last `buffer_steps` batches for replay
//! over a ROUTER socket. With `L` the last applied sequence number:
//!
//! - **start**: replay from 0 (whatever the engine still buffers);
//! - **live `seq == L+1`**: apply;
//! - **live `seq > L+1`** (a gap): buffer it and replay from `L+1`;
//! - **live `seq ≤ L`** outside a requested replay: the engine restarted.
//!   [`Action::EngineRestarted`] tells the caller to send `ALL_CLEARED` for the
//!   replica (and wait for its acknowledgement before sending any later add)
//!   and reset its mapping; then a replay from 0 follows;
//! - **reconnect**: replay from `L` and compare the replayed message at `L`
//!   with the hash of the payload applied at `L`: equal → carry on from `L+1`;
//!   different, or no longer buffered (the replay skips past `L` or ends
//!   without it) → engine restart as above;
//! - **replay timeout** (a malformed request gets no reply at all): give up on
//!   that replay; whatever it did not deliver is reported as
//!   [`Action::Lost`], live messages buffered meanwhile are applied.
//!
//! Live messages arriving during a replay are buffered (bounded) and applied
//! in order after it, so events always apply in sequence order. Each replay
//! has an id; answers to an abandoned replay are ignored.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a subscriber's engine history has reached its server: every
/// rank's first [`Action::CaughtUp`] handled and everything up to it
/// acknowledged by the server (so a lookup there no longer sees stores that
/// the history's later events remove). Set once, never cleared: after that
/// the server follows live events, and a later restart is a clear
/// acknowledged before anything after it. Cheap to clone and to read.
#[derive(Debug, Clone, Default)]
pub struct CaughtUpSignal(Arc<CaughtUpInner>);

#[derive(Debug, Default)]
struct CaughtUpInner {
    set: AtomicBool,
    notify: tokio::sync::Notify,
}

impl CaughtUpSignal {
    /// Not set yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets it (idempotent) and wakes every [`CaughtUpSignal::wait`].
    pub fn set(&self) {
        if !self.0.set.swap(true, Ordering::AcqRel) {
            self.0.notify.notify_waiters();
        }
    }

    /// Whether it is set.
    pub fn is_set(&self) -> bool {
        self.0.set.load(Ordering::Acquire)
    }

    /// Returns once it is set.
    pub async fn wait(&self) {
        loop {
            let notified = self.0.notify.notified();
            tokio::pin!(notified);
            // Registered before the check: a `set` in between still wakes it.
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

/// Identifies one replay request; answers carrying another id are stale.
pub type ReplayId = u64;

/// Hash of a payload, kept for the message applied last (reconnect check).
pub fn payload_hash(payload: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(payload)
}

/// Sequencer settings.
#[derive(Debug, Clone)]
pub struct SequencerConfig {
    /// Whether the engine has a replay endpoint. Without one, gaps are only
    /// counted as lost, and a restart is only seen when `seq` goes backwards.
    pub replay_enabled: bool,
    /// Live messages buffered at most while a replay runs (the oldest are
    /// dropped past it; a later replay or [`Action::Lost`] accounts for them).
    pub max_buffered: usize,
    /// How many recently applied `(seq, payload hash)` pairs are remembered to
    /// tell a late duplicate (same seq, same payload) from a restart.
    pub recent_window: usize,
}

impl Default for SequencerConfig {
    fn default() -> Self {
        Self {
            replay_enabled: true,
            max_buffered: 10_000,
            recent_window: 4_096,
        }
    }
}

/// What the caller must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<P> {
    /// Decode and apply this batch.
    Apply {
        /// Its sequence number.
        seq: u64,
        /// The payload given to the sequencer.
        payload: P,
    },
    /// Send a replay request `[b"", from (8-byte BE)]` on the DEALER socket and
    /// feed the answers back with this id; time it out.
    RequestReplay {
        /// Replay id to pass back.
        id: ReplayId,
        /// First sequence number wanted.
        from: u64,
    },
    /// The engine restarted: send `ALL_CLEARED` for the replica (acknowledged
    /// before any later add) and reset the mapping.
    EngineRestarted,
    /// Messages `from..=to` can no longer be recovered.
    Lost {
        /// First lost sequence number.
        from: u64,
        /// Last lost sequence number.
        to: u64,
    },
    /// No replay is running and everything received has been applied: held
    /// events still waiting for a parent will not get one (drop them). Sent
    /// after every in-order live message and at the end of every replay;
    /// [`Mapping::drop_pending`](crate::Mapping::drop_pending) is O(1) when
    /// nothing is held.
    ///
    /// The first one after [`Sequencer::start`] also says the engine's
    /// history is applied: the replay from 0 ended, failed or timed out
    /// (whatever it did not deliver is lost), or there is no replay endpoint
    /// (then there is no history to apply). Until then the state holds
    /// stores the history may still undo (a later eviction, a prefix-cache
    /// reset): [`CaughtUpSignal`] carries that moment to a router.
    CaughtUp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// Replay from 0: start, or after a restart.
    FromZero,
    /// Fill a gap after `L`.
    Gap,
    /// Reconnect: check that the message at `seq` still hashes to `hash`.
    Verify { seq: u64, hash: u64, verified: bool },
}

#[derive(Debug, Clone, Copy)]
struct Replay {
    id: ReplayId,
    purpose: Purpose,
    /// Whether it delivered anything new (guards against re-requesting a
    /// replay that cannot make progress).
    progressed: bool,
}

/// Counters for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SequenceStats {
    /// Messages applied.
    pub applied: u64,
    /// Messages that could not be recovered.
    pub lost: u64,
    /// Engine restarts detected.
    pub restarts: u64,
    /// Replays requested.
    pub replays: u64,
    /// Replays that timed out.
    pub replay_timeouts: u64,
    /// Duplicates skipped (replayed messages already applied).
    pub duplicates: u64,
    /// Live messages dropped from the full replay buffer.
    pub buffer_overflow: u64,
}

/// Sequence state of one publisher (one data-parallel rank).
#[derive(Debug)]
pub struct Sequencer<P> {
    config: SequencerConfig,
    /// Last applied `(seq, payload hash)`.
    last: Option<(u64, u64)>,
    /// The next sequence number to apply, when known: `L+1`, or 0 once a
    /// replay from 0 showed that the engine had published nothing yet.
    next: Option<u64>,
    replay: Option<Replay>,
    next_id: ReplayId,
    buffered: BTreeMap<u64, (u64, P)>,
    // Applied (seq, hash), strictly increasing seq, bounded by recent_window.
    recent: VecDeque<(u64, u64)>,
    stats: SequenceStats,
}

impl<P> Sequencer<P> {
    /// A sequencer that has applied nothing yet.
    pub fn new(config: SequencerConfig) -> Self {
        Self {
            config,
            last: None,
            next: None,
            replay: None,
            next_id: 0,
            buffered: BTreeMap::new(),
            recent: VecDeque::new(),
            stats: SequenceStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> &SequenceStats {
        &self.stats
    }

    /// Last applied sequence number.
    pub fn last_applied(&self) -> Option<u64> {
        self.last.map(|(s, _)| s)
    }

    /// The running replay, if any. While one runs, events held for an
    /// unknown parent may still be resolved; once none runs they will not.
    pub fn replay_in_flight(&self) -> Option<ReplayId> {
        self.replay.map(|r| r.id)
    }

    /// Call once when the subscription starts.
    pub fn start(&mut self) -> Vec<Action<P>> {
        let mut out = Vec::new();
        self.begin_replay(0, Purpose::FromZero, &mut out);
        if self.replay.is_none() {
            out.push(Action::CaughtUp);
        }
        out
    }

    /// The engine has been unreachable past the grace: its cache is no
    /// longer vouched for. Everything is forgotten and the caller withdraws
    /// the replica like a restart ([`Action::EngineRestarted`]); when the
    /// engine is back, [`Sequencer::reconnected`] replays from 0 (a full
    /// resync of whatever it still holds).
    pub fn engine_down(&mut self) -> Vec<Action<P>> {
        self.last = None;
        self.next = None;
        self.replay = None;
        self.buffered.clear();
        self.recent.clear();
        vec![Action::EngineRestarted]
    }

    /// Call after the SUB socket reconnected (messages may have been missed).
    pub fn reconnected(&mut self) -> Vec<Action<P>> {
        let mut out = Vec::new();
        match self.last {
            Some((seq, hash)) => self.begin_replay(
                seq,
                Purpose::Verify {
                    seq,
                    hash,
                    verified: false,
                },
                &mut out,
            ),
            None => {
                // Nothing applied to check continuity against: start over; the
                // replay re-delivers whatever buffered message still exists.
                self.buffered.clear();
                self.next = None;
                self.begin_replay(0, Purpose::FromZero, &mut out);
            }
        }
        out
    }

    /// A message from the live SUB stream.
    pub fn live(&mut self, seq: u64, hash: u64, payload: P) -> Vec<Action<P>> {
        let mut out = Vec::new();
        if let Some((last, _)) = self.last {
            if seq <= last {
                // A live message already applied (it was also in a replay and
                // came late off the SUB queue) carries the same payload; any
                // other backwards number is a new publisher process.
                if self.recent_hash(seq) == Some(hash) {
                    self.stats.duplicates += 1;
                    return out;
                }
                self.restart(&mut out);
            }
        }
        if self.replay.is_some() {
            self.buffer(seq, hash, payload);
            return out;
        }
        match self.next {
            Some(next) if seq > next && self.config.replay_enabled => {
                self.buffer(seq, hash, payload);
                self.begin_replay(next, Purpose::Gap, &mut out);
            }
            _ => {
                self.apply(seq, hash, payload, &mut out);
                // Everything before it has been applied or declared lost, so a
                // parent that is still unknown will never arrive.
                out.push(Action::CaughtUp);
            }
        }
        out
    }

    /// One message of replay `id`.
    pub fn replayed(&mut self, id: ReplayId, seq: u64, hash: u64, payload: P) -> Vec<Action<P>> {
        let mut out = Vec::new();
        let Some(mut replay) = self.replay.filter(|r| r.id == id) else {
            return out;
        };
        if let Purpose::Verify {
            seq: at,
            hash: want,
            verified: false,
        } = replay.purpose
        {
            if seq < at {
                return out;
            }
            if seq > at || hash != want {
                // Not the message we applied at L: a different engine process.
                self.restart(&mut out);
                return out;
            }
            replay.purpose = Purpose::Verify {
                seq: at,
                hash: want,
                verified: true,
            };
            self.replay = Some(replay);
            self.stats.duplicates += 1;
            return out;
        }
        // The replayed copy supersedes a buffered live copy of the same message.
        self.buffered.remove(&seq);
        if self.next.is_some_and(|next| seq < next) {
            self.stats.duplicates += 1;
        } else {
            replay.progressed = true;
            self.replay = Some(replay);
            self.apply(seq, hash, payload, &mut out);
        }
        out
    }

    /// The end marker (`seq = -1`) of replay `id`.
    pub fn replay_ended(&mut self, id: ReplayId) -> Vec<Action<P>> {
        let mut out = Vec::new();
        let Some(replay) = self.replay.filter(|r| r.id == id) else {
            return out;
        };
        match replay.purpose {
            Purpose::Verify {
                verified: false, ..
            } => {
                // The message at L is no longer buffered: continuity unproven.
                self.restart(&mut out);
                return out;
            }
            // The engine's buffer had everything from 0: numbering of
            // anything not yet seen starts at 0.
            Purpose::FromZero if self.next.is_none() => self.next = Some(0),
            _ => {}
        }
        self.replay = None;
        self.drain(
            replay.progressed || replay.purpose == Purpose::FromZero,
            &mut out,
        );
        out
    }

    /// Replay `id` got no (complete) answer in time.
    pub fn replay_timed_out(&mut self, id: ReplayId) -> Vec<Action<P>> {
        let mut out = Vec::new();
        if self.replay.is_some_and(|r| r.id == id) {
            // An unanswered reconnect check is not evidence of a restart: a
            // silent replay socket would otherwise wipe the replica on every
            // reconnect. Live numbering still catches a restart.
            self.stats.replay_timeouts += 1;
            self.replay = None;
            self.drain(false, &mut out);
        }
        out
    }

    fn recent_hash(&self, seq: u64) -> Option<u64> {
        self.recent
            .binary_search_by_key(&seq, |&(s, _)| s)
            .ok()
            .and_then(|i| self.recent.get(i))
            .map(|&(_, h)| h)
    }

    fn begin_replay(&mut self, from: u64, purpose: Purpose, out: &mut Vec<Action<P>>) {
        if !self.config.replay_enabled {
            self.replay = None;
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.stats.replays += 1;
        self.replay = Some(Replay {
            id,
            purpose,
            progressed: false,
        });
        out.push(Action::RequestReplay { id, from });
    }

    fn restart(&mut self, out: &mut Vec<Action<P>>) {
        self.stats.restarts += 1;
        self.last = None;
        self.next = None;
        self.buffered.clear();
        self.recent.clear();
        out.push(Action::EngineRestarted);
        // Without a replay socket the live stream itself restarts the sequence.
        self.begin_replay(0, Purpose::FromZero, out);
    }

    fn apply(&mut self, seq: u64, hash: u64, payload: P, out: &mut Vec<Action<P>>) {
        if let Some(next) = self.next {
            if seq > next {
                self.stats.lost += seq - next;
                out.push(Action::Lost {
                    from: next,
                    to: seq - 1,
                });
            }
        }
        self.last = Some((seq, hash));
        self.next = Some(seq + 1);
        self.recent.push_back((seq, hash));
        while self.recent.len() > self.config.recent_window.max(1) {
            self.recent.pop_front();
        }
        self.stats.applied += 1;
        out.push(Action::Apply { seq, payload });
    }

    fn buffer(&mut self, seq: u64, hash: u64, payload: P) {
        self.buffered.insert(seq, (hash, payload));
        while self.buffered.len() > self.config.max_buffered.max(1) {
            self.buffered.pop_first();
            self.stats.buffer_overflow += 1;
        }
    }

    /// Applies buffered live messages in order after a replay. A hole before
    /// them is replayed again when the last replay made progress (the hole
    /// was published after its snapshot); otherwise it is lost.
    fn drain(&mut self, may_retry: bool, out: &mut Vec<Action<P>>) {
        if may_retry && self.config.replay_enabled {
            if let (Some(next), Some((&first, _))) = (self.next, self.buffered.first_key_value()) {
                if first > next {
                    self.begin_replay(next, Purpose::Gap, out);
                    return;
                }
            }
        }
        while let Some((seq, (hash, payload))) = self.buffered.pop_first() {
            if self.next.is_some_and(|next| seq < next) {
                self.stats.duplicates += 1;
            } else {
                self.apply(seq, hash, payload, out);
            }
        }
        out.push(Action::CaughtUp);
    }
}
