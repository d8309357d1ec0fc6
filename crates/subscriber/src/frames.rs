//! ZMQ multipart framing of the engines' publisher and replay sockets
//! (`engine-wire-formats.md` §5.1, §5.3). Pure functions, no sockets.

use bytes::Bytes;

/// One live message: `[topic, seq (8-byte BE), payload]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveFrame {
    /// Sequence number.
    pub seq: u64,
    /// msgpack `EventBatch`.
    pub payload: Bytes,
}

/// One message on the replay DEALER socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayFrame {
    /// A buffered batch.
    Message {
        /// Sequence number.
        seq: u64,
        /// msgpack `EventBatch`.
        payload: Bytes,
    },
    /// The end marker, `seq = -1`.
    End,
}

/// Parses a live SUB message. The seq is the frame before the payload, so
/// a missing or extra topic frame does not matter; `None` when malformed.
pub fn parse_live(frames: &[Bytes]) -> Option<LiveFrame> {
    let [.., seq, payload] = frames else {
        return None;
    };
    Some(LiveFrame {
        seq: be_u64(seq)?,
        payload: payload.clone(),
    })
}

/// Parses a replay reply: `[b"", topic, seq, payload]` (vLLM ≥ #45177) or
/// `[b"", seq, payload]` (older vLLM, SGLang). `None` when malformed.
pub fn parse_replay(frames: &[Bytes]) -> Option<ReplayFrame> {
    // The empty delimiter is the DEALER side of the ROUTER envelope.
    let frames = match frames {
        [first, rest @ ..] if first.is_empty() && rest.len() >= 2 => rest,
        _ => frames,
    };
    let (seq, payload) = match frames {
        [_, seq, payload] | [seq, payload] => (seq, payload),
        _ => return None,
    };
    let raw: [u8; 8] = seq.as_ref().try_into().ok()?;
    if i64::from_be_bytes(raw) == -1 {
        return Some(ReplayFrame::End);
    }
    Some(ReplayFrame::Message {
        seq: u64::from_be_bytes(raw),
        payload: payload.clone(),
    })
}

/// The replay request a DEALER sends: `[b"", start_seq (8-byte BE)]`.
pub fn replay_request(from: u64) -> Vec<Bytes> {
    vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())]
}

fn be_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

/// The endpoint of data-parallel rank `rank`, as the engines derive it:
/// TCP port + rank; `inproc://` and `ipc://` paths get a `_dp<rank>` suffix.
/// Rank 0 is the endpoint itself.
pub fn endpoint_for_rank(endpoint: &str, rank: u32) -> Option<String> {
    if rank == 0 {
        return Some(endpoint.to_owned());
    }
    if endpoint.starts_with("inproc://") || endpoint.starts_with("ipc://") {
        return Some(format!("{endpoint}_dp{rank}"));
    }
    let (host, port) = endpoint.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let port = port.checked_add(u16::try_from(rank).ok()?)?;
    Some(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(v: &[u8]) -> Bytes {
        Bytes::copy_from_slice(v)
    }

    #[test]
    fn live_frames() {
        let f = parse_live(&[b(b"kv-events"), b(&7u64.to_be_bytes()), b(b"payload")]).unwrap();
        assert_eq!((f.seq, &f.payload[..]), (7, &b"payload"[..]));
        let f = parse_live(&[b(b""), b(&u64::MAX.to_be_bytes()), b(b"")]).unwrap();
        assert_eq!(f.seq, u64::MAX);
        assert!(parse_live(&[b(b"payload")]).is_none());
        assert!(parse_live(&[b(b"t"), b(b"short"), b(b"p")]).is_none());
        assert!(parse_live(&[]).is_none());
    }

    #[test]
    fn replay_frames_with_and_without_topic() {
        let seq = 3u64.to_be_bytes();
        let want = ReplayFrame::Message {
            seq: 3,
            payload: b(b"p"),
        };
        assert_eq!(
            parse_replay(&[b(b""), b(b"kv"), b(&seq), b(b"p")]),
            Some(want.clone())
        );
        assert_eq!(
            parse_replay(&[b(b""), b(b""), b(&seq), b(b"p")]),
            Some(want.clone())
        );
        assert_eq!(parse_replay(&[b(b""), b(&seq), b(b"p")]), Some(want));
        let end = (-1i64).to_be_bytes();
        // vLLM 0.33's marker: [b'', b'', -1, b'']
        assert_eq!(
            parse_replay(&[b(b""), b(b""), b(&end), b(b"")]),
            Some(ReplayFrame::End)
        );
        assert_eq!(
            parse_replay(&[b(b""), b(&end), b(b"")]),
            Some(ReplayFrame::End)
        );
        assert_eq!(parse_replay(&[b(b""), b(b"x"), b(b"p")]), None);
        assert_eq!(parse_replay(&[b(b"")]), None);
    }

    #[test]
    fn request_and_rank_endpoints() {
        assert_eq!(
            replay_request(258),
            vec![b(b""), b(&[0, 0, 0, 0, 0, 0, 1, 2])]
        );
        assert_eq!(
            endpoint_for_rank("tcp://*:5557", 0).as_deref(),
            Some("tcp://*:5557")
        );
        assert_eq!(
            endpoint_for_rank("tcp://10.0.0.1:5557", 2).as_deref(),
            Some("tcp://10.0.0.1:5559")
        );
        assert_eq!(
            endpoint_for_rank("tcp://[::1]:5557", 1).as_deref(),
            Some("tcp://[::1]:5558")
        );
        assert_eq!(
            endpoint_for_rank("inproc://kv", 1).as_deref(),
            Some("inproc://kv_dp1")
        );
        assert_eq!(endpoint_for_rank("tcp://host:65535", 1), None);
        assert_eq!(endpoint_for_rank("tcp://host", 1), None);
    }
}
