//! The checking half of loading: a key's value as given ([`Field`]), the problems found so far
//! ([`Problems`], [`Section`]), and the serde pass that reads the raw structs, noting every unknown
//! key instead of stopping at the first, so that every bad setting is reported at once.

use std::time::Duration;

use figment::Figment;
use figment::value::{Dict, Value};
use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, MapAccess, Visitor};

/// A key's value as the file or the environment gave it, not yet checked. A value of the wrong
/// type is kept as the reason it does not read, so that it is reported with the other problems
/// rather than stopping serde at the first.
#[derive(Debug, Default)]
pub enum Field<T> {
    #[default]
    Absent,
    Given(Result<T, String>),
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = <Value as Deserialize>::deserialize(deserializer)?;
        Ok(Field::Given(value.deserialize::<T>().map_err(|error| error.kind.to_string())))
    }
}

impl<T> Field<T> {
    pub fn is_given(&self) -> bool {
        matches!(self, Field::Given(_))
    }
}

/// A raw struct's key checked into its runtime value: `key!(s, self.field, default)` reads it as
/// it is, `key!(s, self.field, default, check)` turns it into the runtime value or explains why
/// not. The key is the field's name, so each key is spelled once: as the raw struct's field.
macro_rules! key {
    ($section:ident, $raw:ident . $key:ident, $default:expr) => {
        $section.parse(stringify!($key), $raw.$key, $default, Ok)
    };
    ($section:ident, $raw:ident . $key:ident, $default:expr, $check:expr) => {
        $section.parse(stringify!($key), $raw.$key, $default, $check)
    };
}

/// Like [`key!`] for a secret: the text exactly as given (see [`Section::secret`]).
macro_rules! secret {
    ($section:ident, $raw:ident . $key:ident, $default:expr, $check:expr) => {
        $section.secret(stringify!($key), $raw.$key, $default, $check)
    };
}

/// A raw sub-section validated into its runtime struct, its keys named under the field's name.
macro_rules! section {
    ($section:ident, $raw:ident . $key:ident, $default:expr) => {
        $raw.$key.validate(&mut $section.section(stringify!($key)), $default)
    };
}

pub(crate) use {key, secret, section};

/// Reads a raw section only from a table (`#[serde(deserialize_with = "table")]`): serde would
/// also read a struct from an array, field by field in order, and `upstream = [1, 2]` would set
/// `upstream.openai` and `upstream.anthropic`. Anything but a table is refused, as a key the
/// configuration does not have.
pub fn table<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<T, D::Error> {
    T::deserialize(TableOnly(deserializer))
}

struct TableOnly<D>(D);

impl<'de, D: Deserializer<'de>> Deserializer<'de> for TableOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(MapVisitor(visitor))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

/// Passes a table on to the struct's own visitor; anything else is the wrong type.
struct MapVisitor<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for MapVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.0.expecting(formatter)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(map)
    }
}

/// Every problem and warning found while loading, each naming its key and where it came from.
pub struct Problems<'f> {
    figment: &'f Figment,
    problems: Vec<String>,
    /// Keys that still work but should be changed (deprecated ones), to log at start.
    warnings: Vec<String>,
}

impl<'f> Problems<'f> {
    pub fn new(figment: &'f Figment) -> Self {
        Self { figment, problems: Vec::new(), warnings: Vec::new() }
    }

    /// The top level of the configuration, where sections and top-level keys are checked.
    pub fn root(&mut self) -> Section<'_, 'f> {
        Section { problems: self, prefix: String::new() }
    }

    /// The problems (empty: the configuration is valid) and the warnings.
    pub fn finish(self) -> (Vec<String>, Vec<String>) {
        (self.problems, self.warnings)
    }

    fn problem(&mut self, path: &str, reason: &str) {
        let source = self.source_of(path);
        self.problems.push(format!("`{path}`{source}: {reason}"));
    }

    fn warn(&mut self, path: &str, reason: &str) {
        let source = self.source_of(path);
        self.warnings.push(format!("`{path}`{source}: {reason}"));
    }

    /// Where a key's value came from: the environment variable or the file, for the message.
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

    /// The text of the environment variable that set `path`, when one did.
    fn variable_text(&self, path: &str) -> Option<String> {
        let metadata = self.figment.find_metadata(path)?;
        if !metadata.name.contains("environment") {
            return None;
        }
        std::env::vars_os().find_map(|(name, value)| {
            let name = name.to_str()?;
            (variable_path(name).as_deref() == Some(path)).then(|| value.into_string().ok()).flatten()
        })
    }
}

/// One section of the configuration being checked: its keys' problems are named by their full
/// path.
pub struct Section<'p, 'f> {
    problems: &'p mut Problems<'f>,
    prefix: String,
}

impl<'f> Section<'_, 'f> {
    /// The section `name` inside this one.
    pub fn section(&mut self, name: &str) -> Section<'_, 'f> {
        let prefix = self.path(name);
        Section { problems: self.problems, prefix }
    }

    /// The full path of `key` in this section (the section itself for an empty key).
    pub fn path(&self, key: &str) -> String {
        match (self.prefix.is_empty(), key.is_empty()) {
            (true, _) => key.to_string(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}.{key}", self.prefix),
        }
    }

    /// The value of `key`, or `default` when absent; `check` turns the raw value into the runtime
    /// one or explains why not. A value of the wrong type or one `check` refuses is recorded as a
    /// problem naming the key and its source, and the default stands in.
    pub fn parse<R, T>(
        &mut self,
        key: &str,
        field: Field<R>,
        default: T,
        check: impl FnOnce(R) -> Result<T, String>,
    ) -> T {
        match field {
            Field::Absent => default,
            Field::Given(raw) => match raw.and_then(check) {
                Ok(parsed) => parsed,
                Err(reason) => {
                    self.problem(key, &reason);
                    default
                }
            },
        }
    }

    /// A secret's text exactly as given, then `check`ed. A variable's value is read as it was
    /// written, never as the number or boolean it may look like (`0031415926535` keeps its zeros);
    /// in a file a secret must be a string. A message about it names the key, never the value.
    pub fn secret<T>(
        &mut self,
        key: &str,
        field: Field<Value>,
        default: T,
        check: impl FnOnce(String) -> Result<T, String>,
    ) -> T {
        let Field::Given(Ok(value)) = field else { return default };
        let text = match self.problems.variable_text(&self.path(key)) {
            Some(text) => Some(text),
            None => match value {
                Value::String(_, text) => Some(text),
                _ => None,
            },
        };
        let Some(text) = text else {
            self.problem(key, "must be a string (in quotes); the value is not shown because it is a secret");
            return default;
        };
        match check(text) {
            Ok(parsed) => parsed,
            Err(reason) => {
                self.problem(key, &reason);
                default
            }
        }
    }

    /// Records a problem with `key` of this section.
    pub fn problem(&mut self, key: &str, reason: &str) {
        let path = self.path(key);
        self.problems.problem(&path, reason);
    }

    /// Records a warning about `key` of this section, which is read but should be changed.
    pub fn warn(&mut self, key: &str, reason: &str) {
        let path = self.path(key);
        self.problems.warn(&path, reason);
    }

    /// Reads the raw struct `T` (which refuses unknown keys) from `dict`: each unknown key, and
    /// each section given something other than a table, is taken out and read again without it,
    /// until the rest reads. Returns the raw struct and the full paths of the unknown keys, for
    /// the caller to report after the bad values (as `unknown key`).
    pub fn read_raw<T: DeserializeOwned + Default>(&self, dict: Dict) -> (T, Vec<String>) {
        let mut root = Value::from(dict);
        let mut unknown = Vec::new();
        loop {
            let error = match root.deserialize::<T>() {
                Ok(raw) => return (raw, unknown),
                Err(error) => error,
            };
            // Every leaf is a `Field`, which reads anything: what fails is a key no struct has, or
            // a section that is not a table. Either way the key is not one of the configuration's.
            let Some(value) = take(&mut root, &error.path) else {
                unknown.push(self.path(&error.path.join(".")));
                return (T::default(), unknown);
            };
            collect_leaves(&value, &self.path(&error.path.join(".")), &mut unknown);
        }
    }

    /// Reports the unknown keys `read_raw` found, each with the known key it most likely
    /// misspells when there is one.
    pub fn unknown(&mut self, paths: impl IntoIterator<Item = (String, Option<String>)>) {
        for (path, near) in paths {
            match near {
                Some(near) => self.problems.problem(&path, &format!("unknown key (did you mean `{near}`?)")),
                None => self.problems.problem(&path, "unknown key"),
            }
        }
    }
}

/// Removes the value at `path` from the tree.
fn take(root: &mut Value, path: &[String]) -> Option<Value> {
    let (last, parents) = path.split_last()?;
    let mut dict = dict_mut(root)?;
    for segment in parents {
        dict = dict_mut(dict.get_mut(segment)?)?;
    }
    dict.remove(last)
}

fn dict_mut(value: &mut Value) -> Option<&mut Dict> {
    match value {
        Value::Dict(_, dict) => Some(dict),
        _ => None,
    }
}

/// The leaves of a value (itself, unless it is a table), as full paths; an empty table has none.
fn collect_leaves(value: &Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Dict(_, dict) => {
            for (key, inner) in dict {
                collect_leaves(inner, &format!("{path}.{key}"), out);
            }
        }
        _ => out.push(path.to_string()),
    }
}

/// The key paths the raw struct `T` accepts, asked of serde itself: a table holding only a key no
/// struct has is refused with the list of the fields the struct has. A field that reads a table
/// holding such a key is a leaf (a [`Field`] reads anything); one that refuses it is a section,
/// asked in turn. Returns (leaves, sections).
pub fn accepted_keys<T: DeserializeOwned>() -> (Vec<String>, Vec<String>) {
    let mut leaves = Vec::new();
    let mut sections = Vec::new();
    let mut pending = vec![Vec::<String>::new()];
    while let Some(path) = pending.pop() {
        for field in fields_at::<T>(&path) {
            let mut inner = path.clone();
            inner.push(field.to_string());
            if fields_at::<T>(&inner).is_empty() {
                leaves.push(inner.join("."));
            } else {
                sections.push(inner.join("."));
                pending.push(inner);
            }
        }
    }
    leaves.sort();
    sections.sort();
    (leaves, sections)
}

/// The fields of the struct at `path` in `T` (none when what is there reads anything).
fn fields_at<T: DeserializeOwned>(path: &[String]) -> &'static [&'static str] {
    const PROBE: &str = "\u{0}";
    let mut value = Value::from(Dict::from([(PROBE.to_string(), Value::from(0))]));
    for segment in path.iter().rev() {
        value = Value::from(Dict::from([(segment.clone(), value)]));
    }
    match value.deserialize::<T>() {
        Err(error) => match error.kind {
            figment::error::Kind::UnknownField(_, fields) if error.path.len() == path.len() + 1 => fields,
            _ => &[],
        },
        Ok(_) => &[],
    }
}

/// The variables' common prefix.
pub const PREFIX: &str = "COMPACTOR_";

/// A variable's configuration path: prefix removed, lower case, `__` between levels.
pub fn variable_path(variable: &str) -> Option<String> {
    let rest =
        variable.get(..PREFIX.len()).filter(|p| p.eq_ignore_ascii_case(PREFIX)).map(|_| &variable[PREFIX.len()..])?;
    Some(rest.to_ascii_lowercase().replace("__", "."))
}

/// The value checks the raw sections validate with.
pub(super) fn non_empty(s: String) -> Result<String, String> {
    if s.trim().is_empty() { Err("must not be empty".into()) } else { Ok(s) }
}

/// A share in (0, 1].
/// A list of names, each parsed by `parse` and listed once; `choices` says what they may be.
pub(super) fn distinct<T: PartialEq>(
    names: Vec<String>,
    parse: impl Fn(&str) -> Option<T>,
    choices: &str,
) -> Result<Vec<T>, String> {
    let mut parsed = Vec::new();
    for name in &names {
        let item = parse(name).ok_or_else(|| format!("`{name}` is not one of {choices}"))?;
        if parsed.contains(&item) {
            return Err(format!("`{name}` is listed twice"));
        }
        parsed.push(item);
    }
    Ok(parsed)
}

pub(super) fn share(p: f64) -> Result<f64, String> {
    if p > 0.0 && p <= 1.0 { Ok(p) } else { Err("must be in (0, 1]".into()) }
}

pub(super) fn positive_u32(value: u32) -> Result<u32, String> {
    if value == 0 { Err("must be greater than 0".into()) } else { Ok(value) }
}

pub(super) fn positive(value: u64) -> Result<u64, String> {
    if value == 0 { Err("must be greater than 0".into()) } else { Ok(value) }
}

pub(super) fn ms(value: u64) -> Result<Duration, String> {
    Ok(Duration::from_millis(value))
}

pub(super) fn positive_ms(value: u64) -> Result<Duration, String> {
    positive(value).map(Duration::from_millis)
}
