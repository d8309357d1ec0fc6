//! Loopback against a fake engine speaking vLLM 0.33's framing: PUB
//! `[topic, seq, payload]`, ROUTER replay `[b"", topic, seq, payload]` ending
//! with `[b"", b"", -1, b""]`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/engine.rs"]
mod engine;

use std::time::Duration;

use bytes::Bytes;
use engine::FakeEngine;
use inferencecache_subscriber::{Delivery, TransportConfig, decode_batch, transport};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

const TOPIC: &str = "kv@pod@model";

/// The shared fake engine, publishing one numbered block per batch whose
/// `ts` differs per engine process, as it does in real life.
struct Engine {
    inner: FakeEngine,
    epoch: u64,
}

impl Engine {
    async fn start(answer_replays: bool) -> Self {
        Self {
            inner: FakeEngine::start(TOPIC, answer_replays).await,
            epoch: 0,
        }
    }

    fn payload(&self, seq: u64) -> Bytes {
        let ts = self.epoch as f64 * 1000.0 + seq as f64;
        let ev = common::vllm_stored(&[u64::MAX - seq], None, 0..16, 16);
        Bytes::from(common::vllm_batch(ts, vec![ev]))
    }

    /// Publishes the next batch; `delivered: false` keeps it only in the replay buffer.
    async fn publish(&mut self, delivered: bool) -> u64 {
        let payload = self.payload(self.inner.next_seq());
        self.inner.publish_raw(payload, delivered).await
    }

    fn restart(&mut self) {
        self.epoch += 1;
        self.inner.restart();
    }
}

impl std::ops::Deref for Engine {
    type Target = FakeEngine;
    fn deref(&self) -> &FakeEngine {
        &self.inner
    }
}

impl std::ops::DerefMut for Engine {
    fn deref_mut(&mut self) -> &mut FakeEngine {
        &mut self.inner
    }
}

/// Cancels the transport and waits (bounded) for it to end cleanly.
async fn stop<T: std::fmt::Debug, E: std::fmt::Debug>(
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Result<T, E>>,
) {
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

async fn next(rx: &mut mpsc::Receiver<Delivery>) -> Delivery {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a delivery in time")
        .expect("open")
}

/// Publishes until the subscription has reached the engine's PUB and
/// returns the last seq applied. What a PUB sends before the SUB's
/// subscription arrives is dropped (ZMQ's "slow joiner"), so a probe is
/// sent until one is delivered; a probe lost that way is a gap the next one
/// reveals, which the transport recovers from the replay socket (or, when
/// the replay stays silent, gives up on after its timeout). Every delivery
/// up to the last probe's Apply and the CaughtUp that follows it is read.
async fn until_live(engine: &mut Engine, rx: &mut mpsc::Receiver<Delivery>) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let (last, mut d) = loop {
        let s = engine.publish(true).await;
        match tokio::time::timeout(Duration::from_millis(100), rx.recv()).await {
            Ok(d) => break (s, d.expect("open")),
            Err(_) => assert!(
                tokio::time::Instant::now() < deadline,
                "the subscription never reached the PUB"
            ),
        }
    };
    while !matches!(d, Delivery::Apply { seq, .. } if seq == last) {
        d = next(rx).await;
    }
    assert_eq!(next(rx).await, Delivery::CaughtUp { rank: 0 });
    last
}

async fn expect_apply(rx: &mut mpsc::Receiver<Delivery>, want: u64) -> Bytes {
    match next(rx).await {
        Delivery::Apply {
            rank: 0,
            seq,
            payload,
        } if seq == want => payload,
        other => panic!("expected Apply {want}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_gaps_and_restarts_over_real_sockets() {
    let mut engine = Engine::start(true).await;
    for _ in 0..3 {
        engine.publish(true).await; // before anyone subscribed: only replay has them
    }
    let (tx, mut rx) = mpsc::channel(64);
    let cancel = CancellationToken::new();
    let config = TransportConfig {
        engine_endpoint: engine.pub_endpoint.clone(),
        replay_endpoint: Some(engine.replay_endpoint.clone()),
        topic: "kv@".into(),
        replay_timeout: Duration::from_secs(2),
        ..TransportConfig::default()
    };
    let task = tokio::spawn(transport::run(config, tx, cancel.clone()));

    // start: replay from 0
    for seq in 0..3 {
        let payload = expect_apply(&mut rx, seq).await;
        assert!(decode_batch(&payload).errors.is_empty());
    }
    assert_eq!(next(&mut rx).await, Delivery::CaughtUp { rank: 0 });

    // live in order, once the subscription has reached the PUB
    until_live(&mut engine, &mut rx).await;

    // a gap is filled from the replay socket
    let missed = engine.publish(false).await;
    let s = engine.publish(true).await;
    expect_apply(&mut rx, missed).await;
    expect_apply(&mut rx, s).await;
    assert_eq!(next(&mut rx).await, Delivery::CaughtUp { rank: 0 });

    // the engine restarts: seq goes back to 0 with another payload
    engine.restart();
    let s = engine.publish(true).await;
    assert_eq!(next(&mut rx).await, Delivery::EngineRestarted { rank: 0 });
    let payload = expect_apply(&mut rx, s).await;
    assert_eq!(payload, engine.payload(0));
    assert_eq!(next(&mut rx).await, Delivery::CaughtUp { rank: 0 });

    stop(cancel, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_replay_socket_times_out_and_live_flows() {
    let mut engine = Engine::start(false).await;
    let (tx, mut rx) = mpsc::channel(64);
    let cancel = CancellationToken::new();
    let config = TransportConfig {
        engine_endpoint: engine.pub_endpoint.clone(),
        replay_endpoint: Some(engine.replay_endpoint.clone()),
        replay_timeout: Duration::from_millis(300),
        ..TransportConfig::default()
    };
    let task = tokio::spawn(transport::run(config, tx, cancel.clone()));
    assert_eq!(next(&mut rx).await, Delivery::CaughtUp { rank: 0 });
    until_live(&mut engine, &mut rx).await;
    stop(cancel, task).await;
}

async fn subscribed(
    engine: &Engine,
) -> (
    mpsc::Receiver<Delivery>,
    CancellationToken,
    tokio::task::JoinHandle<Result<(), inferencecache_subscriber::TransportError>>,
) {
    let (tx, rx) = mpsc::channel(64);
    let cancel = CancellationToken::new();
    let config = TransportConfig {
        engine_endpoint: engine.pub_endpoint.clone(),
        replay_endpoint: Some(engine.replay_endpoint.clone()),
        replay_timeout: Duration::from_secs(2),
        ..TransportConfig::default()
    };
    let task = tokio::spawn(transport::run(config, tx, cancel.clone()));
    (rx, cancel, task)
}

/// A connection blip: the SUB reconnects, the replay from L proves it is the
/// same engine, and what was published meanwhile is recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_to_the_same_engine_recovers_the_blip() {
    let mut engine = Engine::start(true).await;
    engine.publish(true).await;
    let (mut rx, cancel, task) = subscribed(&engine).await;
    expect_apply(&mut rx, 0).await;
    assert_eq!(next(&mut rx).await, Delivery::CaughtUp { rank: 0 });
    engine.publish(false).await; // published while the SUB is away
    engine.rebind_publisher().await;
    // the reconnection triggers the continuity check and the recovery
    expect_apply(&mut rx, 1).await;
    assert_eq!(next(&mut rx).await, Delivery::CaughtUp { rank: 0 });
    // Live again on the new connection.
    assert!(until_live(&mut engine, &mut rx).await >= 2);
    stop(cancel, task).await;
}

/// The engine restarted while the SUB was away and has published fewer
/// messages than L: the message at L is gone, so it is a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_to_a_restarted_engine_clears() {
    let mut engine = Engine::start(true).await;
    for _ in 0..3 {
        engine.publish(true).await;
    }
    let (mut rx, cancel, task) = subscribed(&engine).await;
    for seq in 0..3 {
        expect_apply(&mut rx, seq).await;
    }
    assert_eq!(next(&mut rx).await, Delivery::CaughtUp { rank: 0 });
    engine.restart();
    engine.publish(false).await;
    engine.rebind_publisher().await;
    assert_eq!(next(&mut rx).await, Delivery::EngineRestarted { rank: 0 });
    let payload = expect_apply(&mut rx, 0).await;
    assert_eq!(payload, engine.payload(0));
    assert_eq!(next(&mut rx).await, Delivery::CaughtUp { rank: 0 });
    stop(cancel, task).await;
}

/// Bind mode (the engine's PUB connects, as vLLM does for a `tcp://host:port`
/// endpoint), without a replay socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_mode_without_replay() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let (tx, mut rx) = mpsc::channel(64);
    let cancel = CancellationToken::new();
    let config = TransportConfig {
        engine_endpoint: endpoint.clone(),
        bind: true,
        ..TransportConfig::default()
    };
    let task = tokio::spawn(transport::run(config, tx, cancel.clone()));
    assert_eq!(next(&mut rx).await, Delivery::CaughtUp { rank: 0 });
    let mut publisher = PubSocket::new();
    // the SUB may not be listening yet
    for _ in 0..50 {
        if publisher.connect(&endpoint).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let frames = |seq: u64| {
        ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from_static(b"\x92\x00\x90"),
        ])
        .unwrap()
    };
    // Probes until the subscription has reached the PUB (slow joiner); with
    // no replay socket, the first batch that arrives is applied as it is.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seq = 3u64;
    let mut d = loop {
        publisher.send(frames(seq)).await.unwrap();
        match tokio::time::timeout(Duration::from_millis(100), rx.recv()).await {
            Ok(d) => break d.expect("open"),
            Err(_) => {
                assert!(tokio::time::Instant::now() < deadline, "never subscribed");
                seq += 1;
            }
        }
    };
    while !matches!(d, Delivery::Apply { seq: s, .. } if s == seq) {
        d = next(&mut rx).await;
    }
    assert_eq!(next(&mut rx).await, Delivery::CaughtUp { rank: 0 });
    publisher.send(frames(seq + 1)).await.unwrap();
    expect_apply(&mut rx, seq + 1).await;
    stop(cancel, task).await;
}
