//! Where templates come from: the `POST /templates` body (a JSON array) and
//! `--templates-dir` (one YAML or JSON object per file). Both use the
//! operator's wire type and compile every template before anything is put in
//! force: one bad template refuses the whole push or reload.

use super::render::{CompiledTemplate, Slot, SlotKind};
use crate::named::{FileKind, NamedSet, Source};
use crate::store_metrics::StoreMetrics;
use crate::watch::{decode_yaml_or_json, read_limited};
use inferencecache_control_api::templates::{PromptTemplate, SlotKind as WireSlotKind};
use std::path::{Path, PathBuf};

/// Most bytes of one template file (the `/policy` body limit).
pub(super) const MAX_TEMPLATE_FILE_BYTES: usize = crate::policy::MAX_POLICY_BODY_BYTES;

/// Most template files one directory may hold.
pub(super) const MAX_TEMPLATE_FILES: usize = 4096;

fn compile(t: PromptTemplate) -> Result<(String, CompiledTemplate), String> {
    let slots = t
        .slots
        .into_iter()
        .map(|s| Slot {
            kind: match s.kind {
                WireSlotKind::Stable => SlotKind::Stable,
                WireSlotKind::Mutable => SlotKind::Mutable,
            },
            required: s.required.unwrap_or(false),
            name: s.name,
        })
        .collect();
    let c = CompiledTemplate::compile(&t.namespace, &t.name, t.revision.as_deref(), &t.body, slots)
        .map_err(|e| e.to_string())?;
    Ok((format!("{}/{}", t.namespace, t.name), c))
}

fn build(list: Vec<PromptTemplate>, source: Source) -> Result<NamedSet<CompiledTemplate>, String> {
    let compiled = list
        .into_iter()
        .map(compile)
        .collect::<Result<Vec<_>, _>>()?;
    NamedSet::build(compiled, source).map_err(|e| format!("template {e}"))
}

/// Decodes and compiles a `POST /templates` body.
pub(crate) fn decode_templates_json(body: &[u8]) -> Result<NamedSet<CompiledTemplate>, String> {
    let list: Vec<PromptTemplate> =
        serde_json::from_slice(body).map_err(|e| format!("decode templates: {e}"))?;
    build(list, Source::Http)
}

/// True for the files a templates directory is made of: `*.yaml`, `*.yml`,
/// `*.json`, not hidden (a ConfigMap volume's `..data` entries are skipped).
fn is_template_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    !name.starts_with('.')
        && ["yaml", "yml", "json"]
            .iter()
            .any(|x| ext.eq_ignore_ascii_case(x))
        && path.is_file()
}

/// Loads every template file of a directory.
pub(crate) fn load_templates_dir(dir: &Path) -> Result<NamedSet<CompiledTemplate>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("read directory {}: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| is_template_file(p))
        .collect();
    if files.len() > MAX_TEMPLATE_FILES {
        return Err(format!(
            "{} holds {} template files; the limit is {MAX_TEMPLATE_FILES}",
            dir.display(),
            files.len()
        ));
    }
    files.sort();
    let mut list = Vec::with_capacity(files.len());
    for f in &files {
        let bytes = read_limited(f, MAX_TEMPLATE_FILE_BYTES)?;
        let t: PromptTemplate = decode_yaml_or_json(f, &bytes)?;
        list.push(t);
    }
    build(list, Source::File).map_err(|e| format!("{}: {e}", dir.display()))
}

/// `--templates-dir`: how it loads and what it records.
pub(crate) static TEMPLATES_DIR: FileKind<CompiledTemplate> = FileKind {
    load: load_templates_dir,
    loaded: "templates_dir_loaded",
    reload_failed: "templates_dir_reload_failed",
    applied: StoreMetrics::templates_applied,
    rejected: StoreMetrics::templates_rejected,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ic-tpl-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn yaml_and_json_files_load_and_hidden_or_other_files_are_skipped() {
        let d = dir("mixed");
        std::fs::write(
            d.join("a.yaml"),
            "namespace: team\nname: a\nbody: 'Hi {{ q }}'\nslots:\n  - name: q\n    type: Mutable\n    required: true\n",
        )
        .unwrap();
        std::fs::write(
            d.join("b.json"),
            r#"{"namespace":"team","name":"b","revision":"r1","body":"x","slots":[]}"#,
        )
        .unwrap();
        std::fs::write(d.join(".hidden.yaml"), "garbage: [").unwrap();
        std::fs::write(d.join("README.md"), "not a template").unwrap();
        let set = load_templates_dir(&d).unwrap();
        assert_eq!(set.len(), 2);
        assert_eq!(set.get("team/b").unwrap().revision(), "r1");
        assert_eq!(
            set.get("team/a").unwrap().slots()[0].kind,
            SlotKind::Mutable
        );
    }

    #[test]
    fn one_bad_file_refuses_the_directory_with_its_path() {
        let d = dir("bad");
        std::fs::write(
            d.join("ok.json"),
            r#"{"namespace":"n","name":"ok","body":"x"}"#,
        )
        .unwrap();
        std::fs::write(
            d.join("broken.json"),
            r#"{"namespace":"n","name":"b","body":"{% if %}"}"#,
        )
        .unwrap();
        let e = load_templates_dir(&d).unwrap_err();
        assert!(e.contains("n/b"), "{e}");
    }

    #[test]
    fn push_bodies_decode_and_duplicates_are_refused() {
        let set = decode_templates_json(
            br#"[{"namespace":"n","name":"t","body":"{{ a }}","slots":[{"name":"a","type":"Stable"}]}]"#,
        )
        .unwrap();
        assert_eq!(set.len(), 1);
        assert_eq!(set.source(), Source::Http);
        let e = decode_templates_json(
            br#"[{"namespace":"n","name":"t","body":"x"},{"namespace":"n","name":"t","body":"y"}]"#,
        )
        .unwrap_err();
        assert!(e.contains("n/t") && e.contains("more than once"), "{e}");
        let e = decode_templates_json(br#"{"namespace":"n"}"#).unwrap_err();
        assert!(e.starts_with("decode templates: "), "{e}");
    }
}
