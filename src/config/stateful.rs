//! How a stateful Responses request (`previous_response_id`, `conversation`: its history is kept
//! by the provider) is recovered from its overflow: the rungs of `upstream.openai_stateful` and
//! `upstream.azure_stateful`, in the order they are tried.

use serde::Serialize;

/// One way out of a stateful request's overflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatefulRung {
    /// The provider's own compaction: the request again with `context_management`
    /// (`{"type":"compaction"}`), so the provider compacts the chain and answers from there; its
    /// compaction item is opaque (compactor cannot show what it kept).
    ProviderCompaction,
    /// The chain read back from the provider (`GET /responses/{id}/input_items` and the
    /// response's output), summarized as any conversation, and sent without
    /// `previous_response_id`.
    Rebuild,
    /// The request again with `truncation: "auto"`: the provider drops the oldest items.
    Truncation,
}

/// Where the upstream is OpenAI's own API: its compaction first.
pub const OPENAI_ORDER: [StatefulRung; 3] =
    [StatefulRung::ProviderCompaction, StatefulRung::Rebuild, StatefulRung::Truncation];

/// Anywhere else (Azure OpenAI, a gateway, a local server): no provider compaction, which only
/// OpenAI's API is known to offer.
pub const OTHER_ORDER: [StatefulRung; 2] = [StatefulRung::Rebuild, StatefulRung::Truncation];

impl StatefulRung {
    const ALL: [StatefulRung; 3] = OPENAI_ORDER;

    /// The rung's name in the configuration, the log line's `rungs` and the metrics.
    pub fn name(self) -> &'static str {
        match self {
            StatefulRung::ProviderCompaction => "provider_compaction",
            StatefulRung::Rebuild => "rebuild",
            StatefulRung::Truncation => "truncation",
        }
    }

    pub fn parse(name: &str) -> Option<StatefulRung> {
        Self::ALL.into_iter().find(|rung| rung.name() == name)
    }
}

/// The default order for an upstream at `authority`.
pub fn default_order(authority: &str) -> Vec<StatefulRung> {
    if authority == "api.openai.com" { OPENAI_ORDER.to_vec() } else { OTHER_ORDER.to_vec() }
}

/// The rungs a `*_stateful` key names, each once; an empty list forwards stateful requests as
/// they came, their overflow included.
pub fn rungs(names: Vec<String>) -> Result<Vec<StatefulRung>, String> {
    super::check::distinct(names, StatefulRung::parse, "\"provider_compaction\", \"rebuild\", \"truncation\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_s_own_api_gets_its_compaction_first_and_others_do_not() {
        assert_eq!(default_order("api.openai.com"), OPENAI_ORDER);
        assert_eq!(default_order("my-resource.openai.azure.com"), OTHER_ORDER);
        assert_eq!(default_order("127.0.0.1:8080"), OTHER_ORDER);
    }

    #[test]
    fn a_rung_list_names_each_rung_once() {
        assert_eq!(rungs(vec!["truncation".into()]), Ok(vec![StatefulRung::Truncation]));
        assert_eq!(rungs(vec![]), Ok(vec![]));
        assert!(rungs(vec!["rebuild".into(), "rebuild".into()]).unwrap_err().contains("twice"));
        assert!(rungs(vec!["summarize".into()]).unwrap_err().contains("is not one of"));
    }
}
