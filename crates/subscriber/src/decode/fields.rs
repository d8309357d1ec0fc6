//! One event, read field by field off the cursor.
//!
//! Fields are identified by name (map form) or by position after the tag
//! (tuple form); either way each lands in a [`Fields`] slot while the cursor
//! moves on, and the event is assembled from the slots at the end, so a map
//! may carry `"type"` anywhere. Arrays that become event data (hashes, token
//! ids) are converted as they are read; everything else is kept as its
//! header. Only the first occurrence of a field counts, and nil means absent.

use super::reader::{Head, MAX_LEVEL, Malformed, Reader};
use super::{DecodeOptions, TupleLayout};
use crate::event::{BlockRemoved, BlockStored, EngineEvent, Medium};
use crate::hash::EngineHash;

/// The fields this decoder knows, across event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    BlockHashes,
    Parent,
    TokenIds,
    BlockSize,
    LoraId,
    Medium,
    LoraName,
    ExtraKeys,
    GroupIdx,
    SpecKind,
    SlidingWindow,
    Locality,
    Ownership,
    SessionId,
    CacheSalt,
    Lookahead,
}

impl Field {
    fn by_name(name: &[u8]) -> Option<Self> {
        Some(match name {
            b"block_hashes" => Self::BlockHashes,
            b"parent_block_hash" => Self::Parent,
            b"token_ids" => Self::TokenIds,
            b"block_size" => Self::BlockSize,
            b"lora_id" => Self::LoraId,
            b"medium" => Self::Medium,
            b"lora_name" => Self::LoraName,
            b"extra_keys" => Self::ExtraKeys,
            b"group_idx" => Self::GroupIdx,
            b"kv_cache_spec_kind" => Self::SpecKind,
            b"kv_cache_spec_sliding_window" => Self::SlidingWindow,
            // Map-only keys (vLLM 0.33, SGLang).
            b"locality" => Self::Locality,
            b"ownership" => Self::Ownership,
            b"session_id" => Self::SessionId,
            b"cache_salt" => Self::CacheSalt,
            b"lookahead_token_ids" => Self::Lookahead,
            _ => return None,
        })
    }
}

/// The tags this decoder acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    Stored,
    Removed,
    Cleared,
}

impl Tag {
    fn parse(tag: &str) -> Option<Self> {
        match tag {
            "BlockStored" => Some(Self::Stored),
            "BlockRemoved" => Some(Self::Removed),
            "AllBlocksCleared" => Some(Self::Cleared),
            _ => None,
        }
    }

    /// The field at tuple position `pos` (the tag is at 0). SGLang shares
    /// only the leading positions with vLLM; later ones are not read.
    fn field_at(self, pos: u32, layout: TupleLayout) -> Option<Field> {
        let sglang = layout == TupleLayout::Sglang;
        match (self, pos) {
            (Self::Stored, 7..) if sglang => None,
            (Self::Removed, 3..) if sglang => None,
            (Self::Stored, 1) | (Self::Removed, 1) => Some(Field::BlockHashes),
            (Self::Stored, 2) => Some(Field::Parent),
            (Self::Stored, 3) => Some(Field::TokenIds),
            (Self::Stored, 4) => Some(Field::BlockSize),
            (Self::Stored, 5) => Some(Field::LoraId),
            (Self::Stored, 6) | (Self::Removed, 2) => Some(Field::Medium),
            (Self::Stored, 7) => Some(Field::LoraName),
            (Self::Stored, 8) => Some(Field::ExtraKeys),
            (Self::Stored, 9) | (Self::Removed, 3) => Some(Field::GroupIdx),
            (Self::Stored, 10) => Some(Field::SpecKind),
            (Self::Stored, 11) => Some(Field::SlidingWindow),
            _ => None,
        }
    }
}

/// A field converted while it was read; `None` = absent or nil.
type Converted<T> = Option<Result<T, String>>;

/// Slots for one event. `seen` marks fields already met (first one wins,
/// even when it was nil).
#[derive(Default)]
struct Fields<'a> {
    seen: u32,
    block_hashes: Converted<Vec<EngineHash>>,
    token_ids: Converted<Vec<u32>>,
    lookahead: Converted<Vec<u32>>,
    extra_keys: Option<Vec<Option<rmpv::Value>>>,
    // Scalars (or the header of a container, kept for its kind).
    parent: Option<Head<'a>>,
    block_size: Option<Head<'a>>,
    lora_id: Option<Head<'a>>,
    medium: Option<Head<'a>>,
    lora_name: Option<Head<'a>>,
    group_idx: Option<Head<'a>>,
    spec_kind: Option<Head<'a>>,
    sliding_window: Option<Head<'a>>,
    locality: Option<Head<'a>>,
    ownership: Option<Head<'a>>,
    session_id: Option<Head<'a>>,
    cache_salt: Option<Head<'a>>,
}

/// Outcome of one event: decoded, unknown tag, or an error `(tag, reason)`.
pub(super) type EventResult = Result<Option<EngineEvent>, (String, String)>;

/// Reads one event at `level`. `Err` only when the payload itself is not
/// well-formed msgpack; a bad event is `Ok(Err(..))` with the cursor past it.
pub(super) fn read_event(
    rd: &mut Reader<'_>,
    level: usize,
    options: DecodeOptions,
) -> Result<EventResult, Malformed> {
    match rd.head(level)? {
        Head::Array(n) => read_tuple(rd, n, level, options),
        Head::Map(n) => read_map(rd, n, level),
        other => {
            rd.skip_body(other, level)?;
            Ok(Err(("?".into(), format!("event is {}", other.kind()))))
        }
    }
}

fn skip_elements(rd: &mut Reader<'_>, n: u32, level: usize) -> Result<(), Malformed> {
    for _ in 0..n {
        rd.skip(level)?;
    }
    Ok(())
}

fn read_tuple(
    rd: &mut Reader<'_>,
    n: u32,
    level: usize,
    options: DecodeOptions,
) -> Result<EventResult, Malformed> {
    let no_tag = || Ok(Err(("?".into(), "tuple event without a string tag".into())));
    if n == 0 {
        return no_tag();
    }
    let head = rd.head(level + 1)?;
    rd.skip_body(head, level + 1)?;
    let Some(tag_str) = head.as_str() else {
        skip_elements(rd, n - 1, level + 1)?;
        return no_tag();
    };
    let Some(tag) = Tag::parse(tag_str) else {
        skip_elements(rd, n - 1, level + 1)?;
        return Ok(Ok(None));
    };
    let short = match tag {
        Tag::Stored if n < 5 => Some(
            "tuple needs at least [tag, block_hashes, parent_block_hash, token_ids, block_size]",
        ),
        Tag::Removed if n < 2 => Some("tuple needs at least [tag, block_hashes]"),
        _ => None,
    };
    if let Some(reason) = short {
        skip_elements(rd, n - 1, level + 1)?;
        return Ok(Err((tag_str.to_owned(), reason.to_owned())));
    }
    let tag_owned = tag_str.to_owned();
    let mut fields = Fields::default();
    for pos in 1..n {
        match tag.field_at(pos, options.tuple_layout) {
            Some(field) => fields.read(rd, field, level + 1)?,
            None => rd.skip(level + 1)?,
        }
    }
    Ok(fields.assemble(tag).map_err(|reason| (tag_owned, reason)))
}

fn read_map(rd: &mut Reader<'_>, n: u32, level: usize) -> Result<EventResult, Malformed> {
    let mut fields = Fields::default();
    // The first "type" value: its tag when it is a valid string.
    let mut tag: Option<Option<String>> = None;
    for _ in 0..n {
        let key = rd.head(level + 1)?;
        rd.skip_body(key, level + 1)?;
        let name = match key {
            Head::Str(name) => name,
            _ => &[][..],
        };
        if name == b"type" && tag.is_none() {
            let v = rd.head(level + 1)?;
            rd.skip_body(v, level + 1)?;
            tag = Some(v.as_str().map(str::to_owned));
            continue;
        }
        match Field::by_name(name) {
            Some(field) => fields.read(rd, field, level + 1)?,
            None => rd.skip(level + 1)?,
        }
    }
    let Some(tag_str) = tag.flatten() else {
        return Ok(Err((
            "?".into(),
            "map event without a string \"type\"".into(),
        )));
    };
    match Tag::parse(&tag_str) {
        Some(t) => Ok(fields.assemble(t).map_err(|reason| (tag_str, reason))),
        None => Ok(Ok(None)),
    }
}

impl<'a> Fields<'a> {
    /// Reads the value of `field` at `level` into its slot.
    fn read(&mut self, rd: &mut Reader<'a>, field: Field, level: usize) -> Result<(), Malformed> {
        let bit = 1u32 << (field as u32);
        if self.seen & bit != 0 {
            return rd.skip(level);
        }
        self.seen |= bit;
        let head = rd.head(level)?;
        let slot = match field {
            Field::BlockHashes => {
                self.block_hashes = read_list(rd, head, level, hash)?;
                return Ok(());
            }
            Field::TokenIds => {
                self.token_ids = read_tokens(rd, head, level)?;
                return Ok(());
            }
            Field::Lookahead => {
                self.lookahead = read_tokens(rd, head, level)?;
                return Ok(());
            }
            Field::ExtraKeys => {
                self.extra_keys = read_extra_keys(rd, head, level)?;
                return Ok(());
            }
            Field::Parent => &mut self.parent,
            Field::BlockSize => &mut self.block_size,
            Field::LoraId => &mut self.lora_id,
            Field::Medium => &mut self.medium,
            Field::LoraName => &mut self.lora_name,
            Field::GroupIdx => &mut self.group_idx,
            Field::SpecKind => &mut self.spec_kind,
            Field::SlidingWindow => &mut self.sliding_window,
            Field::Locality => &mut self.locality,
            Field::Ownership => &mut self.ownership,
            Field::SessionId => &mut self.session_id,
            Field::CacheSalt => &mut self.cache_salt,
        };
        rd.skip_body(head, level)?;
        *slot = (head != Head::Nil).then_some(head);
        Ok(())
    }

    /// Builds the event. Checks run in a fixed order so the first problem
    /// reported is the same whatever the wire order of the fields.
    fn assemble(self, tag: Tag) -> Result<Option<EngineEvent>, String> {
        match tag {
            Tag::Cleared => Ok(Some(EngineEvent::AllBlocksCleared)),
            Tag::Removed => Ok(Some(EngineEvent::BlockRemoved(BlockRemoved {
                block_hashes: required_hashes(self.block_hashes)?,
                medium: medium(self.medium)?,
                group_idx: strict(self.group_idx, Head::as_i64, "group_idx", "an i64 integer")?,
            }))),
            Tag::Stored => self.stored().map(|s| Some(EngineEvent::BlockStored(s))),
        }
    }

    fn stored(self) -> Result<BlockStored, String> {
        let block_hashes = required_hashes(self.block_hashes)?;
        let parent_block_hash = self
            .parent
            .map(|h| hash(&h))
            .transpose()
            .map_err(|e| format!("parent_block_hash: {e}"))?;
        let token_ids = self
            .token_ids
            .unwrap_or(Ok(Vec::new()))
            .map_err(|e| format!("token_ids: {e}"))?;
        let block_size = match self.block_size.as_ref().and_then(Head::as_i64) {
            Some(n) if n > 0 && n <= i64::from(i32::MAX) => n as u32,
            Some(n) => return Err(format!("block_size {n} out of range")),
            None => return Err("block_size missing or not an integer".into()),
        };
        let lora_id = strict(self.lora_id, Head::as_i64, "lora_id", "an i64 integer")?;
        let medium = medium(self.medium)?;
        let lora_name = strict(self.lora_name, string, "lora_name", "a string")?;
        let group_idx = strict(self.group_idx, Head::as_i64, "group_idx", "an i64 integer")?;
        Ok(BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id,
            medium,
            lora_name,
            extra_keys: self.extra_keys,
            group_idx,
            kv_cache_spec_kind: self.spec_kind.as_ref().and_then(string),
            kv_cache_spec_sliding_window: self.sliding_window.as_ref().and_then(Head::as_i64),
            locality: self.locality.as_ref().and_then(string),
            ownership: self.ownership.as_ref().and_then(string),
            session_id: self.session_id.as_ref().and_then(string),
            cache_salt: self.cache_salt.as_ref().and_then(string),
            lookahead_token_ids: self.lookahead.and_then(Result::ok).unwrap_or_default(),
        })
    }
}

fn string(h: &Head<'_>) -> Option<String> {
    h.as_str().map(str::to_owned)
}

fn required_hashes(v: Converted<Vec<EngineHash>>) -> Result<Vec<EngineHash>, String> {
    match v {
        Some(Ok(h)) => Ok(h),
        Some(Err(e)) => Err(format!("block_hashes: {e}")),
        None => Err("block_hashes: missing".into()),
    }
}

/// An optional field that must have the right type when present.
fn strict<'a, T>(
    v: Option<Head<'a>>,
    conv: impl Fn(&Head<'a>) -> Option<T>,
    name: &str,
    want: &str,
) -> Result<Option<T>, String> {
    match v {
        None => Ok(None),
        Some(h) => conv(&h)
            .map(Some)
            .ok_or_else(|| format!("{name} is {}, not {want}", h.kind())),
    }
}

fn medium(v: Option<Head<'_>>) -> Result<Option<Medium>, String> {
    strict(v, |h| h.as_str().map(Medium::parse), "medium", "a string")
}

fn hash(h: &Head<'_>) -> Result<EngineHash, String> {
    match *h {
        Head::Uint(u) => Ok(EngineHash::Uint(u)),
        Head::Int(i) => Ok(EngineHash::Int(i)),
        Head::Bin(b) | Head::Str(b) => Ok(EngineHash::Bytes(b.into())),
        other => Err(format!("hash is {}", other.kind())),
    }
}

/// Capacity for `n` declared elements: never more than the bytes left, since
/// each element takes at least one.
fn capacity(rd: &Reader<'_>, n: u32) -> usize {
    (n as usize).min(rd.remaining())
}

/// Reads an array field whose elements are scalars, converting each; the
/// first bad element makes the field an error (the rest is still skipped).
fn read_list<'a, T>(
    rd: &mut Reader<'a>,
    head: Head<'a>,
    level: usize,
    conv: impl Fn(&Head<'a>) -> Result<T, String>,
) -> Result<Converted<Vec<T>>, Malformed> {
    let n = match head {
        Head::Nil => return Ok(None),
        Head::Array(n) => n,
        other => {
            rd.skip_body(other, level)?;
            return Ok(Some(Err(format!("is {}, not an array", other.kind()))));
        }
    };
    let mut items = Vec::with_capacity(capacity(rd, n));
    let mut error = None;
    for i in 0..n {
        let h = rd.head(level + 1)?;
        rd.skip_body(h, level + 1)?;
        if error.is_none() {
            match conv(&h) {
                Ok(v) => items.push(v),
                Err(e) => error = Some(format!("[{i}] {e}")),
            }
        }
    }
    Ok(Some(error.map_or(Ok(items), Err)))
}

fn read_tokens<'a>(
    rd: &mut Reader<'a>,
    head: Head<'a>,
    level: usize,
) -> Result<Converted<Vec<u32>>, Malformed> {
    let n = match head {
        Head::Array(n) if level < MAX_LEVEL => n,
        // Not a plain array within the depth limit: the general path.
        _ => return read_list(rd, head, level, token),
    };
    let mut items = Vec::with_capacity(capacity(rd, n));
    for i in 0..n {
        match rd.small_uint() {
            Some(t) => items.push(t),
            None => {
                // Anything else (wide, negative, not an integer) goes through
                // the full reader, which also reports the error.
                let h = rd.head(level + 1)?;
                rd.skip_body(h, level + 1)?;
                match token(&h) {
                    Ok(t) => items.push(t),
                    Err(e) => {
                        for _ in i + 1..n {
                            rd.skip(level + 1)?;
                        }
                        return Ok(Some(Err(format!("[{i}] {e}"))));
                    }
                }
            }
        }
    }
    Ok(Some(Ok(items)))
}

fn token(h: &Head<'_>) -> Result<u32, String> {
    match *h {
        Head::Uint(n) => u32::try_from(n).map_err(|_| format!("{n} is not a u32 token id")),
        Head::Int(n) => Err(format!("{n} is not a u32 token id")),
        other => Err(format!("is {}", other.kind())),
    }
}

/// `extra_keys` stay opaque values; anything but an array means none.
fn read_extra_keys<'a>(
    rd: &mut Reader<'a>,
    head: Head<'a>,
    level: usize,
) -> Result<Option<Vec<Option<rmpv::Value>>>, Malformed> {
    let Head::Array(n) = head else {
        rd.skip_body(head, level)?;
        return Ok(None);
    };
    let mut items = Vec::with_capacity(capacity(rd, n));
    for _ in 0..n {
        let start = rd.position();
        rd.skip(level + 1)?;
        let mut bytes = rd.span(start);
        // The bytes were just validated; a reader error cannot happen, and
        // would only blank this one key.
        let item = rmpv::decode::read_value(&mut bytes).ok();
        items.push(item.filter(|v| !v.is_nil()));
    }
    Ok(Some(items))
}
