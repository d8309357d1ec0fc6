//! LoRA adapter identity: `--lora-adapter-names` parsing and per-event
//! adapter resolution.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::event::BlockStored;

/// A `--lora-adapter-names` value that cannot be used (exit 2 in the CLI).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoraNamesError {
    /// An entry is not `id=name`.
    #[error("lora adapter entry {0:?} is not id=name")]
    NotAPair(String),
    /// The id is not an integer.
    #[error("lora adapter id {0:?} is not an integer")]
    BadId(String),
    /// The name is empty.
    #[error("lora adapter id {0} has an empty name")]
    EmptyName(i64),
    /// The same id appears twice.
    #[error("lora adapter id {0} appears twice")]
    DuplicateId(i64),
}

/// Parses `id=name,id=name` (the reference's rules: entries are trimmed,
/// blank entries skipped, ids are `i64`, names non-empty, ids unique).
pub fn parse_lora_adapter_names(spec: &str) -> Result<HashMap<i64, String>, LoraNamesError> {
    let mut out = HashMap::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (id, name) = entry
            .split_once('=')
            .ok_or_else(|| LoraNamesError::NotAPair(entry.to_owned()))?;
        let id: i64 = id
            .trim()
            .parse()
            .map_err(|_| LoraNamesError::BadId(id.trim().to_owned()))?;
        let name = name.trim();
        if name.is_empty() {
            return Err(LoraNamesError::EmptyName(id));
        }
        if out.insert(id, name.to_owned()).is_some() {
            return Err(LoraNamesError::DuplicateId(id));
        }
    }
    Ok(out)
}

/// Resolves the adapter of a stored event; interns names so every entry of
/// one adapter shares one allocation.
#[derive(Debug)]
pub(crate) struct AdapterResolver {
    names_by_id: HashMap<i64, String>,
    interned: HashMap<String, Arc<str>>,
    base: Arc<str>,
    warned: HashSet<i64>,
}

impl AdapterResolver {
    pub(crate) fn new(names_by_id: HashMap<i64, String>) -> Self {
        Self {
            names_by_id,
            interned: HashMap::new(),
            base: Arc::from(""),
            warned: HashSet::new(),
        }
    }

    /// `lora_name` wins; otherwise `lora_id` through the configured names;
    /// neither means the base model (`""`). `None` means an unmapped id: the
    /// event must be dropped (fail closed), since indexing it under the base
    /// model would route base-model requests to adapter-only cache.
    pub(crate) fn resolve(&mut self, ev: &BlockStored) -> Option<Arc<str>> {
        if let Some(name) = ev.lora_name.as_deref().filter(|n| !n.is_empty()) {
            return Some(self.intern(name));
        }
        let Some(id) = ev.lora_id else {
            return Some(self.base.clone());
        };
        match self.names_by_id.get(&id) {
            Some(name) => {
                let name = name.clone();
                Some(self.intern(&name))
            }
            None => {
                if self.warned.insert(id) {
                    tracing::warn!(
                        lora_id = id,
                        "BlockStored with a lora_id missing from --lora-adapter-names: dropped (fail closed); further drops for this id are only counted"
                    );
                }
                None
            }
        }
    }

    fn intern(&mut self, name: &str) -> Arc<str> {
        if let Some(a) = self.interned.get(name) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(name);
        self.interned.insert(name.to_owned(), a.clone());
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_rules() {
        assert_eq!(parse_lora_adapter_names("").unwrap(), HashMap::new());
        let m = parse_lora_adapter_names(" 1 = sql , 2=chat,").unwrap();
        assert_eq!(m.get(&1).map(String::as_str), Some("sql"));
        assert_eq!(m.get(&2).map(String::as_str), Some("chat"));
        assert_eq!(
            parse_lora_adapter_names("1"),
            Err(LoraNamesError::NotAPair("1".into()))
        );
        assert_eq!(
            parse_lora_adapter_names("x=a"),
            Err(LoraNamesError::BadId("x".into()))
        );
        assert_eq!(
            parse_lora_adapter_names("1= "),
            Err(LoraNamesError::EmptyName(1))
        );
        assert_eq!(
            parse_lora_adapter_names("1=a,1=b"),
            Err(LoraNamesError::DuplicateId(1))
        );
    }

    #[test]
    fn resolution_order() {
        let mut r = AdapterResolver::new(HashMap::from([(1, "sql".to_owned())]));
        let ev = |id: Option<i64>, name: Option<&str>| BlockStored {
            lora_id: id,
            lora_name: name.map(str::to_owned),
            ..BlockStored::default()
        };
        assert_eq!(r.resolve(&ev(None, None)).as_deref(), Some(""));
        assert_eq!(r.resolve(&ev(Some(1), None)).as_deref(), Some("sql"));
        assert_eq!(
            r.resolve(&ev(Some(9), Some("named"))).as_deref(),
            Some("named")
        );
        assert_eq!(r.resolve(&ev(Some(9), Some(""))), None);
        assert_eq!(r.resolve(&ev(Some(9), None)), None);
        let a = r.resolve(&ev(Some(1), None)).unwrap();
        let b = r.resolve(&ev(None, Some("sql"))).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "names are interned");
    }
}
