//! Which `COMPACTOR_` environment variables are configuration. Kubernetes injects
//! `COMPACTOR_PORT`, `COMPACTOR_SERVICE_HOST`, `COMPACTOR_PORT_8787_TCP_ADDR`... into every pod of a
//! namespace holding a Service named `compactor`, and other tools set their own `COMPACTOR_*`
//! variables: only the variables naming a known key (levels joined by `__`) are read, one that looks
//! like a misspelt key is reported as a warning, the rest are ignored.

use std::collections::BTreeSet;

use figment::providers::Env;

use super::Config;
use crate::tokens::ModelTable;

pub use super::check::{PREFIX, variable_path};

/// Variables that are not configuration keys but are read by compactor itself.
/// (`COMPACTOR_TEST_TOKENIZER_GATE`: see [`crate::tokens::LOAD_GATE_VARIABLE`].)
const OWN_VARIABLES: &[&str] = &["config", "test_tokenizer_gate"];

/// The key paths a variable may name, taken from what the configuration renders.
#[derive(Debug, Clone)]
pub struct KnownKeys {
    leaves: BTreeSet<String>,
    tables: BTreeSet<String>,
    model_fields: BTreeSet<String>,
}

impl KnownKeys {
    /// Every key of the configuration: the leaves of the defaults as `--check-config` renders them,
    /// plus `models.NAME.FIELD` for any model name.
    pub fn of(defaults: &Config) -> Self {
        let mut keys = Self { leaves: BTreeSet::new(), tables: BTreeSet::new(), model_fields: BTreeSet::new() };
        if let Ok(toml::Value::Table(root)) = toml::Value::try_from(defaults) {
            keys.collect(&root, "");
        }
        if let Ok(toml::Value::Table(model)) = toml::Value::try_from(ModelTable::default().lookup("default")) {
            keys.model_fields = model.keys().cloned().collect();
        }
        keys.tables.insert("models".into());
        keys.tables.insert("clients".into());
        // Keys the file accepts but the effective configuration does not render (deprecated ones,
        // converted): a variable may set them too.
        let (accepted, _) = super::check::accepted_keys::<super::raw::RawConfig>();
        keys.leaves.extend(accepted.into_iter().filter(|key| !keys.tables.contains(key)));
        keys
    }

    fn collect(&mut self, table: &toml::Table, prefix: &str) {
        for (key, value) in table {
            let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            match value {
                toml::Value::Table(inner) => {
                    self.collect(inner, &path);
                    self.tables.insert(path);
                }
                _ => {
                    self.leaves.insert(path);
                }
            }
        }
    }

    /// Whether `path` (dot separated, lower case) names a key a variable may set.
    pub fn is_known(&self, path: &str) -> bool {
        if self.leaves.contains(path) {
            return true;
        }
        let segments: Vec<&str> = path.split('.').collect();
        match segments.as_slice() {
            ["models", name, field] => !name.is_empty() && self.model_fields.contains(*field),
            ["clients", tenant, "key_sha256"] => !tenant.is_empty(),
            _ => false,
        }
    }

    /// The known key `path` most likely misspells, if it looks like one: a few edits away from a key
    /// or a section, a key's last part without its section, or a section given a value.
    pub fn misspelt(&self, path: &str) -> Option<&str> {
        if let Some(table) = self.tables.get(path) {
            return Some(table);
        }
        // Mistyped keys are short; Kubernetes' service links (port_8787_tcp_addr) are far from all.
        let allowed = (path.len() / 5).min(2);
        let near = self
            .leaves
            .iter()
            .chain(&self.tables)
            .map(|key| (edit_distance(path, key), key))
            .filter(|(distance, _)| *distance <= allowed)
            .min();
        if let Some((_, key)) = near {
            return Some(key);
        }
        // The key without its section: `COMPACTOR_MAX_BODY_BYTES` for `limits.max_body_bytes`.
        self.leaves.iter().find(|key| key.contains('.') && key.rsplit('.').next() == Some(path)).map(String::as_str)
    }
}

/// The variable that sets `path`.
fn variable_name(path: &str) -> String {
    format!("{PREFIX}{}", path.replace('.', "__").to_ascii_uppercase())
}

/// The environment provider reading only known keys, and one warning per variable that looks like
/// a misspelt key (naming the variable and the key, never the value).
pub fn environment(keys: KnownKeys, variables: impl IntoIterator<Item = String>) -> (Env, Vec<String>) {
    let mut warnings = Vec::new();
    let mut names: Vec<String> = variables.into_iter().collect();
    names.sort();
    for name in names {
        let Some(path) = variable_path(&name) else { continue };
        if OWN_VARIABLES.contains(&path.as_str()) || keys.is_known(&path) {
            continue;
        }
        if let Some(key) = keys.misspelt(&path) {
            let hint = if keys.tables.contains(key) {
                format!("`{key}` is a section; set its keys, e.g. {}", variable_name(&format!("{key}.KEY")))
            } else {
                format!("did you mean {} (`{key}`)?", variable_name(key))
            };
            warnings.push(format!("environment variable {name} is not a configuration key and is ignored; {hint}"));
        }
    }
    let env = Env::prefixed(PREFIX).split("__").filter(move |path| keys.is_known(&path.as_str().to_ascii_lowercase()));
    (env, warnings)
}

/// Levenshtein distance over bytes (keys are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, &x) in a.iter().enumerate() {
        current[0] = i + 1;
        for (j, &y) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(x != y);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warnings_for(variables: &[&str]) -> Vec<String> {
        environment(KnownKeys::of(&Config::default()), variables.iter().map(|v| v.to_string())).1
    }

    #[test]
    fn known_keys_and_model_fields_are_read() {
        let keys = KnownKeys::of(&Config::default());
        for path in ["listen", "limits.max_body_bytes", "session.redis_url", "compaction.threshold"] {
            assert!(keys.is_known(path), "{path}");
        }
        assert!(keys.is_known("models.my-model.context_window"));
        assert!(!keys.is_known("models.my-model.window"));
        assert!(keys.is_known("clients.team-a.key_sha256"));
        assert!(!keys.is_known("clients.team-a.key"));
        assert!(!keys.is_known("limits"));
    }

    #[test]
    fn a_deprecated_key_may_still_be_set_by_a_variable() {
        assert!(KnownKeys::of(&Config::default()).is_known("tokens.cache_entries"));
        assert!(warnings_for(&["COMPACTOR_TOKENS__CACHE_ENTRIES", "COMPACTOR_TOKENS__CACHE_BYTES"]).is_empty());
    }

    #[test]
    fn kubernetes_service_links_are_ignored_without_a_word() {
        let links = [
            "COMPACTOR_PORT",
            "COMPACTOR_SERVICE_HOST",
            "COMPACTOR_SERVICE_PORT",
            "COMPACTOR_SERVICE_PORT_HTTP",
            "COMPACTOR_PORT_8787_TCP",
            "COMPACTOR_PORT_8787_TCP_ADDR",
            "COMPACTOR_PORT_8787_TCP_PORT",
            "COMPACTOR_PORT_8787_TCP_PROTO",
            "COMPACTOR_REDIS_SERVICE_HOST",
            "COMPACTOR_REDIS_PORT_6379_TCP_ADDR",
            "COMPACTOR_CONFIG",
        ];
        assert_eq!(warnings_for(&links), Vec::<String>::new());
    }

    #[test]
    fn misspelt_keys_are_named_with_the_variable_that_was_meant() {
        let warnings = warnings_for(&[
            "COMPACTOR_LIMITS_MAX_BODY_BYTES",
            "COMPACTOR_UPSTREAM__OPENIA",
            "COMPACTOR_MAX_BODY_BYTES",
            "COMPACTOR_SESSION",
        ]);
        assert_eq!(warnings.len(), 4, "{warnings:?}");
        assert!(
            warnings[0].contains("COMPACTOR_LIMITS_MAX_BODY_BYTES")
                && warnings[0].contains("COMPACTOR_LIMITS__MAX_BODY_BYTES")
        );
        assert!(warnings.iter().any(|w| w.contains("COMPACTOR_UPSTREAM__OPENAI")), "{warnings:?}");
        assert!(warnings.iter().any(|w| w.contains("`session` is a section")), "{warnings:?}");
    }

    #[test]
    fn a_variable_may_name_exactly_the_keys_the_file_accepts() {
        let keys = KnownKeys::of(&Config::default());
        let (accepted, sections) = crate::config::check::accepted_keys::<crate::config::raw::RawConfig>();
        assert!(sections.contains(&"compaction".to_string()) && accepted.contains(&"listen".to_string()));
        // `models` and `clients` hold user-named tables (`models.NAME.FIELD`), not a value.
        let accepted: BTreeSet<String> =
            accepted.into_iter().filter(|key| key != "models" && key != "clients").collect();
        assert_eq!(keys.leaves, accepted, "what --check-config renders is what the raw structs read");
        assert!(accepted.len() >= 90, "{accepted:?}");
    }
}
