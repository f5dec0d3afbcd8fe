//! What compactor knows of each model: context window, output cap, tokenizer. A built-in table of
//! current models, overridden or extended by `[models.NAME]` in the configuration.

use std::collections::HashMap;

use serde::Serialize;

/// The tokenizer compactor counts with; other vendors' tokenizers are approximated by o200k
/// counts times [`ModelInfo::token_factor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    O200kBase,
    Cl100kBase,
}

/// One model's limits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ModelInfo {
    pub context_window: u32,
    pub max_output_tokens: u32,
    /// Multiplier applied to the o200k/cl100k count to estimate this vendor's tokens.
    pub token_factor: f32,
    pub encoding: Encoding,
}

const fn m(context_window: u32, max_output_tokens: u32, token_factor: f32, encoding: Encoding) -> ModelInfo {
    ModelInfo { context_window, max_output_tokens, token_factor, encoding }
}

use Encoding::{Cl100kBase as CL, O200kBase as O2};

/// Built-in models, matched by exact name, then by longest prefix. Factors: Claude's tokenizer
/// yields about 1.15-1.3x the o200k count on code and prose; Llama, Qwen, DeepSeek, Mistral and
/// Gemini vocabularies land about 1.05-1.15x.
const BUILT_IN: &[(&str, ModelInfo)] = &[
    // OpenAI
    ("gpt-5", m(400_000, 128_000, 1.0, O2)),
    ("gpt-5-chat", m(128_000, 16_384, 1.0, O2)),
    ("gpt-4.1", m(1_047_576, 32_768, 1.0, O2)),
    ("gpt-4o", m(128_000, 16_384, 1.0, O2)),
    ("chatgpt-4o", m(128_000, 16_384, 1.0, O2)),
    ("gpt-4-turbo", m(128_000, 4_096, 1.0, CL)),
    ("gpt-4-1106", m(128_000, 4_096, 1.0, CL)),
    ("gpt-4-0125", m(128_000, 4_096, 1.0, CL)),
    ("gpt-4-32k", m(32_768, 8_192, 1.0, CL)),
    ("gpt-4", m(8_192, 8_192, 1.0, CL)),
    ("gpt-3.5-turbo", m(16_385, 4_096, 1.0, CL)),
    ("gpt-oss", m(131_072, 131_072, 1.0, O2)),
    ("o1", m(200_000, 100_000, 1.0, O2)),
    ("o1-mini", m(128_000, 65_536, 1.0, O2)),
    ("o3", m(200_000, 100_000, 1.0, O2)),
    ("o4-mini", m(200_000, 100_000, 1.0, O2)),
    ("codex-mini", m(200_000, 100_000, 1.0, O2)),
    // Anthropic
    ("claude", m(200_000, 8_192, 1.2, O2)),
    ("claude-3-haiku", m(200_000, 4_096, 1.2, O2)),
    ("claude-3-opus", m(200_000, 4_096, 1.2, O2)),
    ("claude-3-5", m(200_000, 8_192, 1.2, O2)),
    ("claude-3-7-sonnet", m(200_000, 64_000, 1.2, O2)),
    ("claude-sonnet-4", m(200_000, 64_000, 1.2, O2)),
    ("claude-opus-4", m(200_000, 32_000, 1.2, O2)),
    ("claude-opus-4-5", m(200_000, 64_000, 1.2, O2)),
    ("claude-haiku-4", m(200_000, 64_000, 1.2, O2)),
    // Google
    ("gemini", m(1_048_576, 8_192, 1.1, O2)),
    ("gemini-1.5-pro", m(2_097_152, 8_192, 1.1, O2)),
    ("gemini-2.5", m(1_048_576, 65_536, 1.1, O2)),
    ("gemini-3", m(1_048_576, 65_536, 1.1, O2)),
    ("gemma", m(131_072, 8_192, 1.1, O2)),
    // Meta
    ("llama-3", m(8_192, 4_096, 1.1, O2)),
    ("llama-3.1", m(131_072, 8_192, 1.1, O2)),
    ("llama-3.2", m(131_072, 8_192, 1.1, O2)),
    ("llama-3.3", m(131_072, 8_192, 1.1, O2)),
    ("llama-4", m(1_048_576, 8_192, 1.1, O2)),
    // Mistral
    ("mistral-large", m(131_072, 8_192, 1.1, O2)),
    ("mistral-medium", m(131_072, 8_192, 1.1, O2)),
    ("mistral-small", m(131_072, 8_192, 1.1, O2)),
    ("codestral", m(256_000, 8_192, 1.1, O2)),
    ("devstral", m(131_072, 8_192, 1.1, O2)),
    ("magistral", m(131_072, 40_000, 1.1, O2)),
    // DeepSeek
    ("deepseek", m(131_072, 8_192, 1.1, O2)),
    ("deepseek-reasoner", m(131_072, 65_536, 1.1, O2)),
    ("deepseek-r1", m(131_072, 32_768, 1.1, O2)),
    // Qwen
    ("qwen", m(131_072, 8_192, 1.1, O2)),
    ("qwen3-coder", m(262_144, 65_536, 1.1, O2)),
    ("qwen-turbo", m(1_000_000, 8_192, 1.1, O2)),
    ("qwen-max", m(32_768, 8_192, 1.1, O2)),
    // xAI
    ("grok", m(131_072, 8_192, 1.0, O2)),
    ("grok-4", m(256_000, 64_000, 1.0, O2)),
    ("grok-code", m(256_000, 10_000, 1.0, O2)),
];

/// The fallback for models nobody has heard of (overridable as `[models.default]`).
pub const DEFAULT_MODEL: ModelInfo = m(128_000, 16_384, 1.0, O2);

/// The model table: built-ins plus configured entries, configured ones winning.
#[derive(Debug, Clone)]
pub struct ModelTable {
    entries: HashMap<String, ModelInfo>,
    default: ModelInfo,
    /// The longest name in `entries`: no longer prefix of a client's model can match, so a
    /// lookup never looks past it (the client's `model` can be as long as the body limit).
    longest: usize,
}

impl Default for ModelTable {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl ModelTable {
    pub fn new(configured: Vec<(String, ModelInfo)>) -> Self {
        let mut entries: HashMap<String, ModelInfo> =
            BUILT_IN.iter().map(|(name, info)| ((*name).to_string(), *info)).collect();
        let mut default = DEFAULT_MODEL;
        for (name, info) in configured {
            let name = normalize(&name);
            if name == "default" {
                default = info;
            } else {
                entries.insert(name, info);
            }
        }
        let longest = entries.keys().map(String::len).max().unwrap_or(0);
        Self { entries, default, longest }
    }

    /// The smallest window of any entry or the default: no lookup gives less.
    pub fn smallest_window(&self) -> u32 {
        self.entries.values().map(|info| info.context_window).fold(self.default.context_window, u32::min)
    }

    /// Exact name, then the longest prefix, then the default. Provider prefixes (`openai/`,
    /// `anthropic/`, Bedrock's `us.anthropic.`) and case are ignored.
    ///
    /// The work is bounded by the longest known name, whatever the length of `model`: only the
    /// name's first bytes are normalized, and only prefixes up to the longest known name are
    /// looked up (hashing every prefix of a long unknown name was quadratic in its length).
    pub fn lookup(&self, model: &str) -> ModelInfo {
        let name = normalize(bounded(model, self.longest + NORMALIZED_AWAY));
        if let Some(info) = self.entries.get(&name) {
            return *info;
        }
        (0..=name.len().min(self.longest))
            .rev()
            .filter(|end| name.is_char_boundary(*end))
            .find_map(|end| self.entries.get(&name[..end]))
            .copied()
            .unwrap_or(self.default)
    }
}

/// More than the most bytes [`normalize`] removes from the front of a name after its last `/`
/// (a region and a vendor prefix: `global.deepseek.`).
const NORMALIZED_AWAY: usize = 32;

/// The part of `model` after its last `/`, cut to at most `limit` bytes (at a character boundary).
/// A name cut there is still longer than any known name once normalized, so it matches what the
/// whole name would: no entry exactly, and the same longest prefix.
fn bounded(model: &str, limit: usize) -> &str {
    let name = model.rsplit('/').next().unwrap_or(model);
    &name[..name.floor_char_boundary(limit)]
}

/// Lowercase, without routing prefixes, with OpenRouter's dotted Claude versions dashed.
fn normalize(model: &str) -> String {
    let mut name = model.rsplit('/').next().unwrap_or(model).to_ascii_lowercase();
    for region in ["us.", "eu.", "apac.", "global."] {
        if let Some(rest) = name.strip_prefix(region) {
            name = rest.to_string();
        }
    }
    for vendor in ["anthropic.", "meta.", "mistral.", "openai.", "deepseek.", "qwen."] {
        if let Some(rest) = name.strip_prefix(vendor) {
            name = rest.to_string();
        }
    }
    if name.starts_with("claude") {
        name = name.replace('.', "-");
    }
    name
}

impl Default for ModelInfo {
    fn default() -> Self {
        DEFAULT_MODEL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dated_names_find_their_family_by_longest_prefix() {
        let table = ModelTable::default();
        assert_eq!(table.lookup("gpt-4o-2024-08-06").context_window, 128_000);
        assert_eq!(table.lookup("gpt-4-0613").context_window, 8_192);
        assert_eq!(table.lookup("gpt-4.1-mini").context_window, 1_047_576);
        assert_eq!(table.lookup("claude-sonnet-4-5-20250929").max_output_tokens, 64_000);
        assert_eq!(table.lookup("gpt-4").encoding, Encoding::Cl100kBase);
    }

    #[test]
    fn provider_prefixes_and_case_are_ignored() {
        let table = ModelTable::default();
        assert_eq!(table.lookup("openai/gpt-4o"), table.lookup("gpt-4o"));
        assert_eq!(table.lookup("anthropic/claude-sonnet-4.5").max_output_tokens, 64_000);
        assert_eq!(table.lookup("us.anthropic.claude-3-7-sonnet-20250219-v1:0").max_output_tokens, 64_000);
        assert_eq!(table.lookup("meta-llama/Llama-3.3-70B-Instruct").context_window, 131_072);
    }

    #[test]
    fn unknown_models_get_the_default_and_configuration_wins() {
        let table = ModelTable::new(vec![
            ("my-local-model".into(), m(32_768, 4_096, 1.0, O2)),
            ("default".into(), m(64_000, 8_000, 1.0, O2)),
            ("gpt-4o".into(), m(1_000, 100, 1.0, O2)),
        ]);
        assert_eq!(table.lookup("my-local-model-q4").context_window, 32_768);
        assert_eq!(table.lookup("something-else").context_window, 64_000);
        assert_eq!(table.lookup("gpt-4o-mini").context_window, 1_000);
        assert_eq!(ModelTable::default().lookup("something-else").context_window, 128_000);
    }

    #[test]
    fn a_long_name_finds_what_its_known_prefix_finds() {
        let table = ModelTable::default();
        let tail = "x".repeat(100_000);
        assert_eq!(table.lookup(&format!("gpt-4o-{tail}")), table.lookup("gpt-4o"));
        assert_eq!(table.lookup(&format!("openai/gpt-4-{tail}")), table.lookup("gpt-4"));
        assert_eq!(table.lookup(&format!("us.anthropic.claude-opus-4.5-{tail}")), table.lookup("claude-opus-4-5"));
        assert_eq!(table.lookup(&tail), DEFAULT_MODEL);
        // A multi-byte character where the name is cut: the cut falls on a character boundary.
        for shift in 0..4 {
            let name = format!("gpt-5{}{}", "-".repeat(shift), "é".repeat(50_000));
            assert_eq!(table.lookup(&name), table.lookup("gpt-5"), "shift {shift}");
        }
    }

    #[test]
    fn a_long_configured_name_is_still_matched_exactly_and_by_prefix() {
        let long = format!("local-{}", "q".repeat(300));
        let table = ModelTable::new(vec![(long.clone(), m(9_999, 99, 1.0, O2))]);
        assert_eq!(table.lookup(&long).context_window, 9_999);
        assert_eq!(table.lookup(&format!("{long}-{}", "z".repeat(10_000))).context_window, 9_999);
        assert_eq!(table.lookup(&long[..long.len() - 1]), DEFAULT_MODEL);
    }
}
