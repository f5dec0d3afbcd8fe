//! Reads a merged figment tree key by key, so every unknown key and every bad value is reported at
//! once instead of stopping at the first one serde meets.

use figment::Figment;
use figment::value::{Dict, Value};
use serde::de::DeserializeOwned;

/// Takes keys out of the merged configuration tree; what is left at the end is unknown.
pub struct Reader<'a> {
    figment: &'a Figment,
    root: Dict,
    problems: Vec<String>,
    /// Keys that still work but should be changed (deprecated ones), to log at start.
    warnings: Vec<String>,
    /// Problems by bare key, for sub-table readers.
    relative: Vec<(String, String)>,
}

impl<'a> Reader<'a> {
    pub fn new(figment: &'a Figment, root: Dict) -> Self {
        Self { figment, root, problems: Vec::new(), warnings: Vec::new(), relative: Vec::new() }
    }

    /// The value at `path` (dot separated), or `default` when absent. A value of the wrong type is
    /// recorded as a problem naming the key and its source, and the default stands in.
    pub fn get<T: DeserializeOwned>(&mut self, path: &str, default: T) -> T {
        match self.take(path) {
            None => default,
            Some(value) => match value.deserialize::<T>() {
                Ok(parsed) => parsed,
                Err(error) => {
                    let reason = error.kind.to_string();
                    self.problem(path, &reason);
                    default
                }
            },
        }
    }

    /// Like [`Reader::get`], then `check` turns the raw value into the runtime one or explains why not.
    pub fn parse<R: DeserializeOwned, T>(
        &mut self,
        path: &str,
        default: T,
        check: impl FnOnce(R) -> Result<T, String>,
    ) -> T {
        let Some(value) = self.take(path) else {
            return default;
        };
        match value.deserialize::<R>() {
            Ok(raw) => match check(raw) {
                Ok(parsed) => parsed,
                Err(reason) => {
                    self.problem(path, &reason);
                    default
                }
            },
            Err(error) => {
                self.problem(path, &error.kind.to_string());
                default
            }
        }
    }

    /// A secret's text exactly as given, then `check`ed. A variable's value is read as it was
    /// written, never as the number or boolean it may look like (`0031415926535` keeps its zeros);
    /// in a file a secret must be a string. A message about it names the key, never the value.
    pub fn secret<T>(&mut self, path: &str, default: T, check: impl FnOnce(String) -> Result<T, String>) -> T {
        let Some(value) = self.take(path) else {
            return default;
        };
        let text = match self.variable_text(path) {
            Some(text) => Some(text),
            None => match value {
                Value::String(_, text) => Some(text),
                _ => None,
            },
        };
        let Some(text) = text else {
            self.problem(path, "must be a string (in quotes); the value is not shown because it is a secret");
            return default;
        };
        match check(text) {
            Ok(parsed) => parsed,
            Err(reason) => {
                self.problem(path, &reason);
                default
            }
        }
    }

    /// The text of the environment variable that set `path`, when one did.
    fn variable_text(&self, path: &str) -> Option<String> {
        let metadata = self.figment.find_metadata(path)?;
        if !metadata.name.contains("environment") {
            return None;
        }
        std::env::vars_os().find_map(|(name, value)| {
            let name = name.to_str()?;
            (super::env::variable_path(name).as_deref() == Some(path)).then(|| value.into_string().ok()).flatten()
        })
    }

    /// Removes a whole table of user-named entries (such as `[models.NAME]`) and returns them.
    pub fn table(&mut self, path: &str) -> Vec<(String, Value)> {
        match self.take(path) {
            None => Vec::new(),
            Some(Value::Dict(_, dict)) => dict.into_iter().collect(),
            Some(_) => {
                self.problem(path, "expected a table");
                Vec::new()
            }
        }
    }

    /// Records a problem found by cross-key validation.
    pub fn problem(&mut self, path: &str, reason: &str) {
        self.relative.push((path.to_string(), reason.to_string()));
        let source = self.source_of(path);
        self.problems.push(format!("`{path}`{source}: {reason}"));
    }

    /// Records a warning about a key that is read but should be changed, naming where it came from.
    pub fn warn(&mut self, path: &str, reason: &str) {
        let source = self.source_of(path);
        self.warnings.push(format!("`{path}`{source}: {reason}"));
    }

    /// Whether the configuration sets `path` (without taking it).
    pub fn is_set(&self, path: &str) -> bool {
        let mut segments = path.split('.').peekable();
        let mut dict = &self.root;
        while let Some(segment) = segments.next() {
            match (dict.get(segment), segments.peek()) {
                (Some(_), None) => return true,
                (Some(Value::Dict(_, inner)), Some(_)) => dict = inner,
                _ => return false,
            }
        }
        false
    }

    /// The warnings recorded so far.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    /// Every problem found, unknown keys included; empty means the configuration is valid.
    pub fn finish(mut self) -> Vec<String> {
        let mut unknown = Vec::new();
        collect_leaves(&self.root, "", &mut unknown);
        for path in unknown {
            let source = self.source_of(&path);
            self.problems.push(format!("`{path}`{source}: unknown key"));
        }
        self.problems
    }

    /// Problems of a sub-table reader as (relative key, reason), for the parent to name in full.
    pub fn finish_relative(mut self) -> Vec<(String, String)> {
        let mut unknown = Vec::new();
        collect_leaves(&self.root, "", &mut unknown);
        let mut problems: Vec<(String, String)> = std::mem::take(&mut self.relative);
        problems.extend(unknown.into_iter().map(|key| (key, "unknown key".to_string())));
        problems
    }

    fn take(&mut self, path: &str) -> Option<Value> {
        let mut segments = path.split('.').peekable();
        let mut dict = &mut self.root;
        while let Some(segment) = segments.next() {
            if segments.peek().is_none() {
                return dict.remove(segment);
            }
            match dict.get_mut(segment) {
                Some(Value::Dict(_, inner)) => dict = inner,
                _ => return None,
            }
        }
        None
    }

    /// Where a key's value came from: the environment variable or the file, for the error message.
    fn source_of(&self, path: &str) -> String {
        let Some(metadata) = self.figment.find_metadata(path) else {
            return String::new();
        };
        if metadata.name.contains("environment") {
            let variable = format!("COMPACTOR_{}", path.replace('.', "__").to_uppercase());
            return format!(" (from environment variable {variable})");
        }
        match &metadata.source {
            Some(source) => format!(" (in {source})"),
            None => format!(" (in {})", metadata.name),
        }
    }
}

fn collect_leaves(dict: &Dict, prefix: &str, out: &mut Vec<String>) {
    for (key, value) in dict {
        let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        match value {
            Value::Dict(_, inner) if !inner.is_empty() => collect_leaves(inner, &path, out),
            Value::Dict(_, _) => {}
            _ => out.push(path),
        }
    }
}
