//! The sequence rules without sockets: start, gaps, restarts, reconnects,
//! replay timeouts, stale replays, and a simulated lossy engine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use inferencecache_subscriber::sequence::{Action, Sequencer, SequencerConfig, payload_hash};
use proptest::prelude::*;

type A = Action<u64>;

fn seqr() -> Sequencer<u64> {
    Sequencer::new(SequencerConfig::default())
}

/// Payload = (epoch << 32 | seq), hash derived from it: a restarted engine
/// publishes different payloads under the same numbers.
fn msg(epoch: u64, seq: u64) -> (u64, u64) {
    let payload = (epoch << 32) | seq;
    (payload_hash(&payload.to_be_bytes()), payload)
}

fn live(s: &mut Sequencer<u64>, epoch: u64, seq: u64) -> Vec<A> {
    let (h, p) = msg(epoch, seq);
    s.live(seq, h, p)
}

fn replayed(s: &mut Sequencer<u64>, id: u64, epoch: u64, seq: u64) -> Vec<A> {
    let (h, p) = msg(epoch, seq);
    s.replayed(id, seq, h, p)
}

fn applied(actions: &[A]) -> Vec<u64> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Apply { seq, .. } => Some(*seq),
            _ => None,
        })
        .collect()
}

fn replay_id(actions: &[A], from: u64) -> u64 {
    actions
        .iter()
        .find_map(|a| match a {
            Action::RequestReplay { id, from: f } if *f == from => Some(*id),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no replay from {from} in {actions:?}"))
}

/// A sequencer that replayed nothing at start and applied `0..=last` live.
fn caught_up_at(last: u64) -> Sequencer<u64> {
    let mut s = seqr();
    let id = replay_id(&s.start(), 0);
    s.replay_ended(id);
    for q in 0..=last {
        assert_eq!(applied(&live(&mut s, 0, q)), vec![q]);
    }
    s
}

#[test]
fn start_replays_from_zero_and_buffers_live() {
    let mut s = seqr();
    let a = s.start();
    assert_eq!(a, vec![Action::RequestReplay { id: 0, from: 0 }]);
    let mut all = Vec::new();
    all.extend(replayed(&mut s, 0, 0, 0));
    all.extend(live(&mut s, 0, 3)); // published after the snapshot
    all.extend(replayed(&mut s, 0, 0, 1));
    all.extend(replayed(&mut s, 0, 0, 2));
    assert_eq!(applied(&all), vec![0, 1, 2], "live 3 waits for the replay");
    let end = s.replay_ended(0);
    assert_eq!(applied(&end), vec![3]);
    assert_eq!(end.last(), Some(&Action::CaughtUp));
    assert_eq!(s.last_applied(), Some(3));
}

#[test]
fn start_when_the_engine_buffer_no_longer_has_zero() {
    let mut s = seqr();
    s.start();
    let a = replayed(&mut s, 0, 0, 500);
    assert_eq!(
        applied(&a),
        vec![500],
        "whatever the engine still has is applied"
    );
    assert!(
        !a.iter().any(|x| matches!(x, Action::Lost { .. })),
        "nothing was known before it"
    );
}

#[test]
fn late_live_duplicates_of_replayed_messages_are_skipped() {
    let mut s = seqr();
    s.start();
    for q in 0..4 {
        replayed(&mut s, 0, 0, q);
    }
    s.replay_ended(0);
    // These sat in the SUB queue while the replay ran.
    assert!(live(&mut s, 0, 2).is_empty());
    assert!(live(&mut s, 0, 3).is_empty());
    assert_eq!(applied(&live(&mut s, 0, 4)), vec![4]);
    assert_eq!(s.stats().restarts, 0);
    assert_eq!(s.stats().duplicates, 2);
}

#[test]
fn in_order_live_applies_directly() {
    let mut s = caught_up_at(49);
    assert_eq!(
        live(&mut s, 0, 50),
        vec![
            Action::Apply {
                seq: 50,
                payload: msg(0, 50).1
            },
            Action::CaughtUp
        ]
    );
    assert_eq!(s.stats().applied, 51);
    assert_eq!(s.stats().replays, 1);
}

#[test]
fn gap_replays_from_l_plus_one() {
    let mut s = caught_up_at(2);
    let a = live(&mut s, 0, 5);
    assert!(applied(&a).is_empty());
    let id = replay_id(&a, 3);
    assert!(live(&mut s, 0, 6).is_empty(), "buffered during the replay");
    let mut all = Vec::new();
    for q in 3..=5 {
        all.extend(replayed(&mut s, id, 0, q));
    }
    all.extend(s.replay_ended(id));
    assert_eq!(applied(&all), vec![3, 4, 5, 6]);
    assert_eq!(s.stats().lost, 0);
}

#[test]
fn gap_partly_gone_from_the_engine_buffer_is_lost() {
    let mut s = caught_up_at(2);
    let id = replay_id(&live(&mut s, 0, 9), 3);
    let a = replayed(&mut s, id, 0, 6);
    assert_eq!(a[0], Action::Lost { from: 3, to: 5 });
    assert_eq!(applied(&a), vec![6]);
    let mut all = Vec::new();
    for q in 7..=9 {
        all.extend(replayed(&mut s, id, 0, q));
    }
    all.extend(s.replay_ended(id));
    assert_eq!(applied(&all), vec![7, 8, 9]);
    assert_eq!(s.stats().lost, 3);
}

#[test]
fn backwards_live_seq_is_an_engine_restart() {
    let mut s = caught_up_at(10);
    let a = live(&mut s, 1, 0);
    assert_eq!(
        a[0],
        Action::EngineRestarted,
        "ALL_CLEARED goes out before anything else"
    );
    let id = replay_id(&a, 0);
    assert!(applied(&a).is_empty());
    let mut all = Vec::new();
    all.extend(replayed(&mut s, id, 1, 0));
    all.extend(live(&mut s, 1, 1));
    all.extend(s.replay_ended(id));
    assert_eq!(applied(&all), vec![0, 1]);
    assert_eq!(s.stats().restarts, 1);
    // the applied payloads are the new engine's
    let payloads: Vec<u64> = all
        .iter()
        .filter_map(|a| match a {
            Action::Apply { payload, .. } => Some(*payload),
            _ => None,
        })
        .collect();
    assert_eq!(payloads, vec![msg(1, 0).1, msg(1, 1).1]);
}

#[test]
fn reconnect_with_the_same_engine_continues() {
    let mut s = caught_up_at(5);
    let a = s.reconnected();
    let id = replay_id(&a, 5);
    let mut all = replayed(&mut s, id, 0, 5);
    assert!(all.is_empty(), "the message at L matches");
    all.extend(replayed(&mut s, id, 0, 6));
    all.extend(replayed(&mut s, id, 0, 7));
    all.extend(s.replay_ended(id));
    assert_eq!(applied(&all), vec![6, 7]);
    assert_eq!(s.stats().restarts, 0);
}

#[test]
fn reconnect_to_a_different_engine_is_a_restart() {
    let mut s = caught_up_at(5);
    let id = replay_id(&s.reconnected(), 5);
    let a = replayed(&mut s, id, 1, 5);
    assert_eq!(a[0], Action::EngineRestarted);
    let fresh = replay_id(&a, 0);
    // the rest of the stale replay is ignored
    assert!(replayed(&mut s, id, 1, 6).is_empty());
    assert!(s.replay_ended(id).is_empty());
    let mut all = Vec::new();
    for q in 0..=6 {
        all.extend(replayed(&mut s, fresh, 1, q));
    }
    all.extend(s.replay_ended(fresh));
    assert_eq!(applied(&all), (0..=6).collect::<Vec<_>>());
}

#[test]
fn reconnect_when_l_is_no_longer_buffered_is_a_restart() {
    // the replay starts past L
    let mut s = caught_up_at(5);
    let id = replay_id(&s.reconnected(), 5);
    assert_eq!(replayed(&mut s, id, 0, 8)[0], Action::EngineRestarted);
    // the replay ends without L (e.g. the new engine has fewer messages)
    let mut s = caught_up_at(5);
    let id = replay_id(&s.reconnected(), 5);
    let a = s.replay_ended(id);
    assert_eq!(a[0], Action::EngineRestarted);
    replay_id(&a, 0);
}

#[test]
fn reconnect_before_anything_was_applied_starts_over() {
    let mut s = seqr();
    s.start();
    live(&mut s, 0, 7); // buffered while the start replay runs
    let id = replay_id(&s.reconnected(), 0);
    assert!(
        replayed(&mut s, 0, 0, 0).is_empty(),
        "the first replay is abandoned"
    );
    let mut all = replayed(&mut s, id, 0, 0);
    all.extend(s.replay_ended(id));
    assert_eq!(
        applied(&all),
        vec![0],
        "the pre-reconnect buffer was dropped"
    );
}

#[test]
fn replay_timeout_applies_the_buffer_and_counts_the_loss() {
    let mut s = caught_up_at(2);
    let id = replay_id(&live(&mut s, 0, 5), 3);
    live(&mut s, 0, 6);
    let a = s.replay_timed_out(id);
    assert_eq!(a[0], Action::Lost { from: 3, to: 4 });
    assert_eq!(applied(&a), vec![5, 6]);
    assert_eq!(a.last(), Some(&Action::CaughtUp));
    assert_eq!(s.stats().replay_timeouts, 1);
    // a timed-out reconnect check is not a restart
    let id = replay_id(&s.reconnected(), 6);
    let a = s.replay_timed_out(id);
    assert!(!a.contains(&Action::EngineRestarted));
    assert_eq!(applied(&live(&mut s, 0, 7)), vec![7]);
    // a stale timeout does nothing
    assert!(s.replay_timed_out(id).is_empty());
}

#[test]
fn without_a_replay_socket() {
    let mut s = Sequencer::new(SequencerConfig {
        replay_enabled: false,
        ..SequencerConfig::default()
    });
    assert_eq!(s.start(), vec![Action::CaughtUp]);
    assert_eq!(applied(&live(&mut s, 0, 4)), vec![4]);
    let a = live(&mut s, 0, 7);
    assert_eq!(
        a,
        vec![
            Action::Lost { from: 5, to: 6 },
            Action::Apply {
                seq: 7,
                payload: msg(0, 7).1
            },
            Action::CaughtUp
        ]
    );
    let a = live(&mut s, 1, 0);
    assert_eq!(
        a,
        vec![
            Action::EngineRestarted,
            Action::Apply {
                seq: 0,
                payload: msg(1, 0).1
            },
            Action::CaughtUp
        ]
    );
    assert!(s.reconnected().is_empty());
}

#[test]
fn replay_buffer_is_bounded() {
    let mut s = Sequencer::new(SequencerConfig {
        max_buffered: 2,
        ..SequencerConfig::default()
    });
    let id = replay_id(&s.start(), 0);
    for q in 10..15 {
        live(&mut s, 0, q);
    }
    assert_eq!(s.stats().buffer_overflow, 3);
    // The engine had nothing at the snapshot, so 0..=12 came after it: ask again.
    let again = replay_id(&s.replay_ended(id), 0);
    // Nothing new from that one either: the hole is lost, the buffer applies.
    let a = s.replay_ended(again);
    assert_eq!(a[0], Action::Lost { from: 0, to: 12 });
    assert_eq!(applied(&a), vec![13, 14]);
}

#[test]
fn empty_start_replay_then_a_missed_first_message() {
    let mut s = seqr();
    let id = replay_id(&s.start(), 0);
    assert_eq!(s.replay_ended(id), vec![Action::CaughtUp]);
    // seq 0 was dropped on the SUB side: 1 is a gap from 0
    let again = replay_id(&live(&mut s, 0, 1), 0);
    let mut all = replayed(&mut s, again, 0, 0);
    all.extend(replayed(&mut s, again, 0, 1));
    all.extend(s.replay_ended(again));
    assert_eq!(applied(&all), vec![0, 1]);
}

// ---- simulated engine --------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    /// The engine publishes; the live copy may be dropped (slow joiner, HWM).
    Publish { dropped: bool },
    /// The pending replay request is answered (from the engine's buffer).
    Answer,
    /// The pending replay request times out.
    Timeout,
    /// The SUB socket reconnects.
    Reconnect,
    /// The engine process restarts (the subscriber's connection breaks too).
    Restart,
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => any::<bool>().prop_map(|dropped| Op::Publish { dropped }),
        3 => Just(Op::Answer),
        1 => Just(Op::Timeout),
        1 => Just(Op::Reconnect),
        1 => Just(Op::Restart),
    ]
}

struct Sim {
    epoch: u64,
    published: u64,
    pending: Option<(u64, u64)>, // (replay id, from)
    applied: Vec<(u64, u64)>,    // (epoch, seq) since the last restart notice
}

impl Sim {
    fn handle(&mut self, actions: Vec<A>) {
        for a in actions {
            match a {
                Action::Apply { seq, payload } => {
                    assert_eq!(payload & 0xffff_ffff, seq);
                    self.applied.push((payload >> 32, seq));
                }
                Action::RequestReplay { id, from } => self.pending = Some((id, from)),
                Action::EngineRestarted => self.applied.clear(),
                Action::Lost { .. } | Action::CaughtUp => {}
            }
        }
    }

    fn answer(&mut self, s: &mut Sequencer<u64>) {
        if let Some((id, from)) = self.pending.take() {
            for q in from..self.published {
                let a = replayed(s, id, self.epoch, q);
                self.handle(a);
            }
            let a = s.replay_ended(id);
            self.handle(a);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Whatever is dropped, timed out, reconnected or restarted: applied
    /// numbers only grow between restart notices, nothing from an older engine
    /// survives a restart notice, and once the engine answers a final replay
    /// the subscriber holds exactly the current engine's messages, each once.
    #[test]
    fn simulated_engine(ops in proptest::collection::vec(arb_op(), 0..80)) {
        let mut s = seqr();
        let mut sim = Sim { epoch: 0, published: 0, pending: None, applied: Vec::new() };
        let a = s.start();
        sim.handle(a);
        for op in ops {
            match op {
                Op::Publish { dropped } => {
                    let q = sim.published;
                    sim.published += 1;
                    if !dropped {
                        let a = live(&mut s, sim.epoch, q);
                        sim.handle(a);
                    }
                }
                Op::Answer => sim.answer(&mut s),
                Op::Timeout => {
                    if let Some((id, _)) = sim.pending.take() {
                        let a = s.replay_timed_out(id);
                        sim.handle(a);
                    }
                }
                Op::Reconnect => {
                    let a = s.reconnected();
                    sim.handle(a);
                }
                Op::Restart => {
                    sim.epoch += 1;
                    sim.published = 0;
                    sim.pending = None; // the old ROUTER is gone
                    let a = s.reconnected();
                    sim.handle(a);
                }
            }
            for w in sim.applied.windows(2) {
                prop_assert!(w[0].1 < w[1].1, "applied out of order: {:?}", sim.applied);
            }
        }
        // Settle: one delivered message, then answer replays until quiet.
        let q = sim.published;
        sim.published += 1;
        let a = live(&mut s, sim.epoch, q);
        sim.handle(a);
        for _ in 0..4 {
            sim.answer(&mut s);
        }
        prop_assert!(sim.pending.is_none());
        // A timed-out replay can lose messages, and combined with dropped
        // live messages hide a restart; without timeouts everything is exact.
        if s.stats().replay_timeouts == 0 {
            let want: Vec<(u64, u64)> = (0..sim.published).map(|q| (sim.epoch, q)).collect();
            prop_assert_eq!(&sim.applied, &want);
        }
    }
}

#[test]
fn an_engine_down_past_the_grace_is_withdrawn_then_fully_replayed() {
    let mut s = caught_up_at(5);
    assert_eq!(s.engine_down(), vec![Action::EngineRestarted]);
    assert_eq!(s.last_applied(), None);
    // Back: a full replay from 0 (the same engine re-delivers what it still
    // buffers; everything is applied again, as after a restart).
    let id = replay_id(&s.reconnected(), 0);
    let mut all = Vec::new();
    for q in 0..=6 {
        all.extend(replayed(&mut s, id, 0, q));
    }
    all.extend(s.replay_ended(id));
    assert_eq!(applied(&all), (0..=6).collect::<Vec<_>>());
}
