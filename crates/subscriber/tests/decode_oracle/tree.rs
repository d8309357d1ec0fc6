//! The decoder this crate shipped before the streaming one: it reads the
//! payload into an `rmpv` value tree, then converts it. Kept verbatim (apart
//! from imports) as the oracle the streaming decoder must agree with.

use rmpv::ValueRef;
use rmpv::decode::read_value_ref_with_max_depth;

use inferencecache_subscriber::{
    BlockRemoved, BlockStored, DecodeError, DecodeOptions, DecodedBatch, EngineEvent, EngineHash,
    Medium, TupleLayout,
};

/// Deepest nesting the decoder will follow. Real payloads need about 6
/// (batch → events → event → extra_keys → per-block tuple → item); the cap
/// bounds recursion on hostile input.
const MAX_DEPTH: usize = 32;

/// Decodes one `EventBatch` payload. Never panics, whatever the input.
pub(crate) fn decode_batch_with(payload: &[u8], options: DecodeOptions) -> DecodedBatch {
    let mut out = DecodedBatch::default();
    let mut rd = payload;
    let root = match read_value_ref_with_max_depth(&mut rd, MAX_DEPTH) {
        Ok(v) => v,
        Err(e) => {
            out.errors.push(DecodeError::Msgpack(e.to_string()));
            return out;
        }
    };
    let (ts, events, rank) = match &root {
        ValueRef::Array(items) => {
            if items.len() < 2 {
                out.errors.push(DecodeError::Batch(format!(
                    "array batch has {} elements, need at least [ts, events]",
                    items.len()
                )));
                return out;
            }
            (items.first(), items.get(1), items.get(2))
        }
        ValueRef::Map(pairs) => (
            map_get(pairs, "ts"),
            map_get(pairs, "events"),
            map_get(pairs, "data_parallel_rank").or_else(|| map_get(pairs, "attn_dp_rank")),
        ),
        other => {
            out.errors.push(DecodeError::Batch(format!(
                "batch is {}, not an array or map",
                kind(other)
            )));
            return out;
        }
    };
    out.ts = ts.and_then(as_f64).filter(|t| t.is_finite()).unwrap_or(0.0);
    out.data_parallel_rank = rank.and_then(as_i64);
    let events = match events {
        Some(ValueRef::Array(events)) => events,
        Some(ValueRef::Nil) => return out,
        Some(other) => {
            out.errors.push(DecodeError::Batch(format!(
                "events is {}, not an array",
                kind(other)
            )));
            return out;
        }
        None => {
            out.errors
                .push(DecodeError::Batch("batch has no events".to_owned()));
            return out;
        }
    };
    out.events.reserve(events.len());
    for (index, ev) in events.iter().enumerate() {
        match decode_event(ev, options) {
            Ok(Some(e)) => out.events.push(e),
            Ok(None) => out.unknown_events += 1,
            Err((tag, reason)) => out.errors.push(DecodeError::Event { index, tag, reason }),
        }
    }
    out
}

type EventResult = Result<Option<EngineEvent>, (String, String)>;

/// Field access shared by the tuple and the map form. Position `p` is the
/// tuple index (the tag is at 0); `name` is the map key.
enum Fields<'a, 'v> {
    Tuple(&'v [ValueRef<'a>], usize),
    Map(&'v [(ValueRef<'a>, ValueRef<'a>)]),
}

impl<'a, 'v> Fields<'a, 'v> {
    /// The field, or `None` when absent, nil, or beyond the layout's limit.
    fn get(&self, pos: usize, name: &str) -> Option<&'v ValueRef<'a>> {
        let v = match self {
            Fields::Tuple(items, limit) if pos < *limit => items.get(pos),
            Fields::Tuple(..) => None,
            Fields::Map(pairs) => map_get(pairs, name),
        };
        v.filter(|v| !matches!(v, ValueRef::Nil))
    }

    fn tuple_len(&self) -> Option<usize> {
        match self {
            Fields::Tuple(items, _) => Some(items.len()),
            Fields::Map(_) => None,
        }
    }
}

fn decode_event(ev: &ValueRef<'_>, options: DecodeOptions) -> EventResult {
    let sglang = options.tuple_layout == TupleLayout::Sglang;
    let (tag, fields) = match ev {
        ValueRef::Array(items) => match items.first().and_then(as_str) {
            Some(tag) => {
                let limit = match (sglang, tag) {
                    (true, "BlockStored") => 7,
                    (true, "BlockRemoved") => 3,
                    _ => usize::MAX,
                };
                (tag, Fields::Tuple(items, limit))
            }
            None => return Err(("?".into(), "tuple event without a string tag".into())),
        },
        ValueRef::Map(pairs) => match map_get(pairs, "type").and_then(as_str) {
            Some(tag) => (tag, Fields::Map(pairs)),
            None => return Err(("?".into(), "map event without a string \"type\"".into())),
        },
        other => return Err(("?".into(), format!("event is {}", kind(other)))),
    };
    let fail = |reason: String| (tag.to_owned(), reason);
    match tag {
        "BlockStored" => {
            if fields.tuple_len().is_some_and(|n| n < 5) {
                return Err(fail(
                    "tuple needs at least [tag, block_hashes, parent_block_hash, token_ids, block_size]".into(),
                ));
            }
            decode_stored(&fields)
                .map(|s| Some(EngineEvent::BlockStored(s)))
                .map_err(fail)
        }
        "BlockRemoved" => {
            if fields.tuple_len().is_some_and(|n| n < 2) {
                return Err(fail("tuple needs at least [tag, block_hashes]".into()));
            }
            decode_removed(&fields)
                .map(|r| Some(EngineEvent::BlockRemoved(r)))
                .map_err(fail)
        }
        "AllBlocksCleared" => Ok(Some(EngineEvent::AllBlocksCleared)),
        _ => Ok(None),
    }
}

fn decode_stored(f: &Fields<'_, '_>) -> Result<BlockStored, String> {
    let block_hashes =
        hashes(f.get(1, "block_hashes")).map_err(|e| format!("block_hashes: {e}"))?;
    let parent_block_hash = f
        .get(2, "parent_block_hash")
        .map(hash)
        .transpose()
        .map_err(|e| format!("parent_block_hash: {e}"))?;
    let token_ids = tokens(f.get(3, "token_ids")).map_err(|e| format!("token_ids: {e}"))?;
    let block_size = match f.get(4, "block_size").and_then(as_i64) {
        Some(n) if n > 0 && n <= i64::from(i32::MAX) => n as u32,
        Some(n) => return Err(format!("block_size {n} out of range")),
        None => return Err("block_size missing or not an integer".into()),
    };
    let lora_id = strict_opt(f.get(5, "lora_id"), as_i64, "lora_id", "an i64 integer")?;
    let medium = medium(f.get(6, "medium"))?;
    let lora_name = strict_opt(f.get(7, "lora_name"), as_string, "lora_name", "a string")?;
    let extra_keys = f.get(8, "extra_keys").and_then(|v| match v {
        ValueRef::Array(items) => Some(
            items
                .iter()
                .map(|k| (!matches!(k, ValueRef::Nil)).then(|| k.to_owned()))
                .collect(),
        ),
        _ => None,
    });
    let group_idx = strict_opt(f.get(9, "group_idx"), as_i64, "group_idx", "an i64 integer")?;
    Ok(BlockStored {
        block_hashes,
        parent_block_hash,
        token_ids,
        block_size,
        lora_id,
        medium,
        lora_name,
        extra_keys,
        group_idx,
        kv_cache_spec_kind: f.get(10, "kv_cache_spec_kind").and_then(as_string),
        kv_cache_spec_sliding_window: f.get(11, "kv_cache_spec_sliding_window").and_then(as_i64),
        // Map-only keys (vLLM 0.33, SGLang): position usize::MAX never matches a tuple.
        locality: f.get(usize::MAX, "locality").and_then(as_string),
        ownership: f.get(usize::MAX, "ownership").and_then(as_string),
        session_id: f.get(usize::MAX, "session_id").and_then(as_string),
        cache_salt: f.get(usize::MAX, "cache_salt").and_then(as_string),
        lookahead_token_ids: tokens(f.get(usize::MAX, "lookahead_token_ids")).unwrap_or_default(),
    })
}

fn decode_removed(f: &Fields<'_, '_>) -> Result<BlockRemoved, String> {
    Ok(BlockRemoved {
        block_hashes: hashes(f.get(1, "block_hashes")).map_err(|e| format!("block_hashes: {e}"))?,
        medium: medium(f.get(2, "medium"))?,
        group_idx: strict_opt(f.get(3, "group_idx"), as_i64, "group_idx", "an i64 integer")?,
    })
}

/// An optional field that must have the right type when present.
fn strict_opt<T>(
    v: Option<&ValueRef<'_>>,
    conv: impl Fn(&ValueRef<'_>) -> Option<T>,
    name: &str,
    want: &str,
) -> Result<Option<T>, String> {
    match v {
        None => Ok(None),
        Some(v) => conv(v)
            .map(Some)
            .ok_or_else(|| format!("{name} is {}, not {want}", kind(v))),
    }
}

fn medium(v: Option<&ValueRef<'_>>) -> Result<Option<Medium>, String> {
    strict_opt(v, |v| as_str(v).map(Medium::parse), "medium", "a string")
}

fn hashes(v: Option<&ValueRef<'_>>) -> Result<Vec<EngineHash>, String> {
    match v {
        Some(ValueRef::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, h)| hash(h).map_err(|e| format!("[{i}] {e}")))
            .collect(),
        Some(other) => Err(format!("is {}, not an array", kind(other))),
        None => Err("missing".into()),
    }
}

fn hash(v: &ValueRef<'_>) -> Result<EngineHash, String> {
    match v {
        ValueRef::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => Ok(EngineHash::Uint(u)),
            (None, Some(s)) => Ok(EngineHash::Int(s)),
            (None, None) => Err("integer out of range".into()),
        },
        ValueRef::Binary(b) => Ok(EngineHash::Bytes((*b).into())),
        ValueRef::String(s) => Ok(EngineHash::Bytes(s.as_bytes().into())),
        other => Err(format!("hash is {}", kind(other))),
    }
}

fn tokens(v: Option<&ValueRef<'_>>) -> Result<Vec<u32>, String> {
    match v {
        None => Ok(Vec::new()),
        Some(ValueRef::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, t)| match t {
                ValueRef::Integer(n) => n
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| format!("[{i}] {n} is not a u32 token id")),
                other => Err(format!("[{i}] is {}", kind(other))),
            })
            .collect(),
        Some(other) => Err(format!("is {}, not an array", kind(other))),
    }
}

fn map_get<'v, 'a>(
    pairs: &'v [(ValueRef<'a>, ValueRef<'a>)],
    name: &str,
) -> Option<&'v ValueRef<'a>> {
    pairs
        .iter()
        .find(|(k, _)| as_str(k) == Some(name))
        .map(|(_, v)| v)
}

fn as_str<'v>(v: &'v ValueRef<'_>) -> Option<&'v str> {
    match v {
        ValueRef::String(s) => s.as_str(),
        _ => None,
    }
}

fn as_string(v: &ValueRef<'_>) -> Option<String> {
    as_str(v).map(str::to_owned)
}

fn as_i64(v: &ValueRef<'_>) -> Option<i64> {
    match v {
        ValueRef::Integer(i) => i.as_i64(),
        _ => None,
    }
}

fn as_f64(v: &ValueRef<'_>) -> Option<f64> {
    match v {
        ValueRef::F64(f) => Some(*f),
        ValueRef::F32(f) => Some(f64::from(*f)),
        ValueRef::Integer(i) => i.as_f64(),
        _ => None,
    }
}

fn kind(v: &ValueRef<'_>) -> &'static str {
    match v {
        ValueRef::Nil => "nil",
        ValueRef::Boolean(_) => "a bool",
        ValueRef::Integer(_) => "an integer",
        ValueRef::F32(_) | ValueRef::F64(_) => "a float",
        ValueRef::String(_) => "a string",
        ValueRef::Binary(_) => "binary",
        ValueRef::Array(_) => "an array",
        ValueRef::Map(_) => "a map",
        ValueRef::Ext(..) => "an ext",
    }
}
