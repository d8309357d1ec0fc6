//! A minimal engine-side publisher on loopback, for benchmarks and smoke
//! runs of the whole path without an engine: a ZMQ PUB socket sending
//! `[topic, seq, payload]` with vLLM ≥ 0.26-shaped batches (positional
//! envelope, tagged-map events). No replay socket: tests that need one
//! build it with the engines' own shape (see the crate's tests).

use std::ops::Range;

use bytes::Bytes;
use rmpv::Value;
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

/// One `BlockStored`: engine hashes, parent, tokens.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Engine block hashes, in chain order.
    pub hashes: Vec<u64>,
    /// Parent engine hash; `None` for a root.
    pub parent: Option<u64>,
    /// Token ids of all blocks (`hashes.len() * block_size` of them).
    pub tokens: Range<u32>,
}

/// Encodes one batch of `BlockStored` events (medium GPU, no LoRA).
pub fn stored_batch(ts: f64, events: &[Stored], block_size: u32) -> Vec<u8> {
    churn_batch(ts, &[], events, block_size)
}

/// Encodes one batch that first removes `removed` from the GPU, one
/// `BlockRemoved` per block in the given order (vLLM emits one per evicted
/// block, a chain's tail first), then stores `stored` like [`stored_batch`]:
/// a full engine cache frees blocks to make room for new ones.
pub fn churn_batch(ts: f64, removed: &[u64], stored: &[Stored], block_size: u32) -> Vec<u8> {
    let removals = removed.iter().map(|&h| {
        Value::Map(vec![
            ("type".into(), "BlockRemoved".into()),
            ("block_hashes".into(), Value::Array(vec![Value::from(h)])),
            ("medium".into(), "GPU".into()),
        ])
    });
    let stores = stored.iter().map(|e| {
        Value::Map(vec![
            ("type".into(), "BlockStored".into()),
            (
                "block_hashes".into(),
                Value::Array(e.hashes.iter().map(|&h| Value::from(h)).collect()),
            ),
            (
                "parent_block_hash".into(),
                e.parent.map_or(Value::Nil, Value::from),
            ),
            (
                "token_ids".into(),
                Value::Array(e.tokens.clone().map(Value::from).collect()),
            ),
            ("block_size".into(), Value::from(block_size)),
            ("lora_id".into(), Value::Nil),
            ("medium".into(), "GPU".into()),
            ("lora_name".into(), Value::Nil),
        ])
    });
    let events = removals.chain(stores).collect();
    let v = Value::Array(vec![Value::F64(ts), Value::Array(events), Value::from(0)]);
    let mut buf = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut buf, &v);
    buf
}

/// A bound PUB socket with its own sequence numbers.
pub struct LoopbackEngine {
    socket: PubSocket,
    topic: Bytes,
    seq: u64,
    /// Where it is bound, e.g. `tcp://127.0.0.1:40123`.
    pub endpoint: String,
}

impl std::fmt::Debug for LoopbackEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopbackEngine")
            .field("endpoint", &self.endpoint)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl LoopbackEngine {
    /// Binds on an ephemeral loopback port.
    pub async fn bind(topic: &str) -> Result<Self, zeromq::ZmqError> {
        let mut socket = PubSocket::new();
        let endpoint = socket.bind("tcp://127.0.0.1:0").await?.to_string();
        Ok(Self {
            socket,
            topic: Bytes::copy_from_slice(topic.as_bytes()),
            seq: 0,
            endpoint,
        })
    }

    /// Sends one payload with the next sequence number; returns it.
    pub async fn publish(&mut self, payload: Vec<u8>) -> Result<u64, zeromq::ZmqError> {
        let seq = self.seq;
        self.seq += 1;
        let frames = vec![
            self.topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(payload),
        ];
        let msg =
            ZmqMessage::try_from(frames).map_err(|_| zeromq::ZmqError::Other("empty message"))?;
        self.socket.send(msg).await?;
        Ok(seq)
    }
}
