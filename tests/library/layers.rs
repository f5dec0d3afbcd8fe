//! The layering of `src/` (docs/architecture.md, "Layers"): every `crate::…` path a module names
//! points to its own layer or one below. A module that needs something of a layer above it is a
//! shape to mend (the shared thing goes one layer lower, or the call goes to the layer above
//! both), never an import to add, so the layering cannot rot again.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The layers, lowest first, and the top-level modules of each: the table in
/// docs/architecture.md.
const LAYERS: [(&str, &[&str]); 12] = [
    (
        "base",
        &[
            "allocator",
            "boxed",
            "hex",
            "json",
            "sse",
            "event_stream",
            "work",
            "healthcheck",
            "tokens",
            "conversation",
            "route",
            "error",
            "inflight",
        ],
    ),
    ("provider", &["dialect", "overflow", "usage"]),
    ("policy", &["rewrite"]),
    ("config", &["config"]),
    ("telemetry", &["telemetry"]),
    ("credentials", &["cloud"]),
    ("state", &["session"]),
    ("transport", &["upstream"]),
    ("engine", &["compaction"]),
    ("http", &["proxy"]),
    ("ui", &["inspector"]),
    ("server", &["server", "lib", "main"]),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, modules)| modules.contains(&module))
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") && path.file_name().is_some_and(|n| n != "tests.rs") {
            // A module's tests in their own file (`#[cfg(test)] mod tests;`) may use anything.
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to (`src/session/ctx.rs` → `session`).
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    first.trim_end_matches(".rs").to_string()
}

/// The top-level modules a file names as `crate::name` in its code, outside its `#[cfg(test)]`
/// tail (a module's own tests may use anything) and its comments (a doc link up is a pointer for
/// the reader, not a dependency).
fn named(text: &str) -> BTreeSet<String> {
    let head = text.split("#[cfg(test)]").next().unwrap_or(text);
    let code: String = head.lines().filter(|line| !line.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let code = code.as_str();
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        let name: String = after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if !name.is_empty() {
            found.insert(name);
        }
        // `use crate::{a, b::c}`: every name in the braces.
        if let Some(group) = after.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or("");
            for part in inner.split(',') {
                let name: String = part.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    found.insert(name);
                }
            }
        }
        rest = after;
    }
    found
}

#[test]
fn every_module_imports_only_from_its_own_layer_or_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut unplaced = BTreeSet::new();
    let mut upward = Vec::new();
    for file in &files {
        let module = module_of(&src, file);
        let Some(own) = layer_of(&module) else {
            unplaced.insert(module);
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for target in named(&text) {
            match layer_of(&target) {
                Some(layer) if layer > own => upward.push(format!(
                    "{} ({}) -> crate::{target} ({})",
                    file.strip_prefix(&src).unwrap().display(),
                    LAYERS[own].0,
                    LAYERS[layer].0
                )),
                Some(_) => {}
                None => {
                    unplaced.insert(target);
                }
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "modules in no layer (add them to the table here and in docs/architecture.md): {unplaced:?}"
    );
    assert!(upward.is_empty(), "imports that point up a layer:\n{}", upward.join("\n"));
}

#[test]
fn the_layer_table_in_the_architecture_page_is_this_one() {
    let page = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md")).unwrap();
    for (layer, modules) in LAYERS {
        let row = page
            .lines()
            .find(|line| line.starts_with(&format!("| {layer} |")))
            .unwrap_or_else(|| panic!("docs/architecture.md has no row for the layer `{layer}`"));
        for module in modules {
            assert!(row.contains(&format!("`{module}`")), "the `{layer}` row does not name `{module}`: {row}");
        }
    }
}
