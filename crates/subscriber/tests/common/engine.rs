//! A fake engine speaking vLLM's ZMQ framing over real sockets: PUB
//! `[topic, seq, payload]` for live batches, and a ROUTER answering replay
//! requests `[b"", start_seq]` from its buffer with `[b"", topic, seq,
//! payload]` frames, ended by `[b"", b"", -1, b""]`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use inferencecache_subscriber::forward::{ForwardConfig, Identity};
use inferencecache_subscriber::mapping::MappingConfig;
use inferencecache_subscriber::sidecar::SidecarConfig;
use inferencecache_subscriber::{DecodeOptions, TransportConfig};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

type Buffer = Arc<Mutex<Vec<(u64, Bytes)>>>;

pub(crate) struct FakeEngine {
    topic: &'static str,
    publisher: PubSocket,
    buffer: Buffer,
    next_seq: u64,
    pub pub_endpoint: String,
    pub replay_endpoint: String,
}

impl FakeEngine {
    /// A one-rank sidecar reading this engine (live and replay) and reporting
    /// to `server` as `replica` of model "m", tenant "t", with a short window
    /// and fast reconnects, so tests wait milliseconds, not seconds.
    pub(crate) fn sidecar_config(
        &self,
        server: std::net::SocketAddr,
        replica: &str,
        mapping: MappingConfig,
    ) -> SidecarConfig {
        SidecarConfig {
            transport: TransportConfig {
                engine_endpoint: self.pub_endpoint.clone(),
                replay_endpoint: Some(self.replay_endpoint.clone()),
                topic: self.topic.into(),
                replay_timeout: Duration::from_secs(2),
                retry_backoff: Duration::from_millis(100),
                ..TransportConfig::default()
            },
            first_rank: 0,
            ranks: 1,
            mapping,
            decode: DecodeOptions::default(),
            forward: ForwardConfig {
                server: server.to_string(),
                identity: Identity {
                    replica_id: replica.into(),
                    model_id: "m".into(),
                    tenant_id: "t".into(),
                    hash_scheme: "vllm".into(),
                },
                window: Duration::from_millis(20),
                backoff_initial: Duration::from_millis(50),
                backoff_max: Duration::from_millis(400),
                ..ForwardConfig::default()
            },
            stats: None,
            http_bind: Some("127.0.0.1:0".into()),
        }
    }

    /// Binds PUB and ROUTER on ephemeral loopback ports. With
    /// `answer_replays: false` the ROUTER stays silent, as an engine does
    /// for a request it cannot parse.
    pub(crate) async fn start(topic: &'static str, answer_replays: bool) -> Self {
        Self::start_answering_after(topic, answer_replays, Duration::ZERO).await
    }

    /// [`FakeEngine::start`] whose ROUTER answers each replay `delay` after
    /// the request, as a busy engine does: the sidecar is connected to its
    /// server by then, so the history arrives as live deliveries would.
    #[allow(dead_code)] // not every test binary uses it
    pub(crate) async fn start_answering_after(
        topic: &'static str,
        answer_replays: bool,
        delay: Duration,
    ) -> Self {
        let mut publisher = PubSocket::new();
        let pub_endpoint = publisher
            .bind("tcp://127.0.0.1:0")
            .await
            .unwrap()
            .to_string();
        let mut router = RouterSocket::new();
        let replay_endpoint = router.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
        let buffer: Buffer = Arc::default();
        let buf = buffer.clone();
        tokio::spawn(async move {
            while let Ok(msg) = router.recv().await {
                let frames = msg.into_vec();
                if !answer_replays || frames.len() != 3 || !frames[1].is_empty() {
                    continue; // a malformed request gets no reply at all
                }
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                let start = u64::from_be_bytes(frames[2].as_ref().try_into().unwrap());
                let id = frames[0].clone();
                let items: Vec<(u64, Bytes)> = buf
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(s, _)| *s >= start)
                    .cloned()
                    .collect();
                for (seq, payload) in items {
                    let reply = vec![
                        id.clone(),
                        Bytes::new(),
                        Bytes::from_static(topic.as_bytes()),
                        Bytes::copy_from_slice(&seq.to_be_bytes()),
                        payload,
                    ];
                    let _ = router.send(ZmqMessage::try_from(reply).unwrap()).await;
                }
                let end = vec![
                    id,
                    Bytes::new(),
                    Bytes::new(),
                    Bytes::copy_from_slice(&(-1i64).to_be_bytes()),
                    Bytes::new(),
                ];
                let _ = router.send(ZmqMessage::try_from(end).unwrap()).await;
            }
        });
        Self {
            topic,
            publisher,
            buffer,
            next_seq: 0,
            pub_endpoint,
            replay_endpoint,
        }
    }

    /// The sequence number the next publish gets.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Publishes one payload with the next sequence number; `delivered:
    /// false` drops it on the wire (it stays replayable), like a message
    /// lost to the high-water mark.
    pub(crate) async fn publish_raw(&mut self, payload: Bytes, delivered: bool) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.buffer.lock().unwrap().push((seq, payload.clone()));
        if delivered {
            let frames = vec![
                Bytes::from_static(self.topic.as_bytes()),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload,
            ];
            self.publisher
                .send(ZmqMessage::try_from(frames).unwrap())
                .await
                .unwrap();
        }
        seq
    }

    /// Drops the PUB socket (connections break) and binds a new one on the same port.
    pub(crate) async fn rebind_publisher(&mut self) {
        let old = std::mem::replace(&mut self.publisher, PubSocket::new());
        let _ = old.close().await;
        // The port is free once the old socket has let go of it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while let Err(e) = self.publisher.bind(&self.pub_endpoint).await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "cannot bind {} again: {e}",
                self.pub_endpoint
            );
            self.publisher = PubSocket::new();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A new engine process: sequence back to 0, replay buffer empty.
    pub(crate) fn restart(&mut self) {
        self.next_seq = 0;
        self.buffer.lock().unwrap().clear();
    }
}
