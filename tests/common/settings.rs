//! Rewrite settings for library tests: the shipped defaults, with the windows a test needs.

use compactor::config::Config;
use compactor::rewrite::{RewriteSettings, Rewriter};
use compactor::tokens::{ModelTable, TokenCounter};

/// Builds [`RewriteSettings`] from the defaults; tokenizing always stays on the calling thread.
pub struct Settings(RewriteSettings);

impl Settings {
    pub fn defaults() -> Self {
        let mut settings = Config::default().rewrite_settings();
        settings.blocking_tokenize_bytes = usize::MAX;
        Self(settings)
    }

    /// The protected window of recent outputs, and the least a prune must save.
    pub fn prune_window(mut self, protect_tokens: u32, minimum_tokens: u32) -> Self {
        self.0.prune.protect_tokens = protect_tokens;
        self.0.prune.minimum_tokens = minimum_tokens;
        self
    }

    pub fn placeholder(mut self, placeholder: &str) -> Self {
        self.0.prune.placeholder = compactor::rewrite::placeholder::Template::new(placeholder);
        self
    }

    pub fn protected_tools(mut self, tools: &[&str]) -> Self {
        self.0.prune.protected_tools = tools.iter().map(|t| t.to_string()).collect();
        self
    }

    pub fn tool_output_max_tokens(mut self, tokens: u32) -> Self {
        self.0.tool_output_max_tokens = tokens;
        self
    }

    pub fn build(self) -> RewriteSettings {
        self.0
    }

    /// A rewriter with these settings, the built-in model table and a token cache of `cache_bytes`.
    pub fn rewriter(self, cache_bytes: u64) -> Rewriter {
        Rewriter::new(self.0, TokenCounter::new(cache_bytes), ModelTable::default())
    }
}

impl From<RewriteSettings> for Settings {
    fn from(settings: RewriteSettings) -> Self {
        Self(settings)
    }
}
