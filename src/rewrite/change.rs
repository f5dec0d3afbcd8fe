//! The kinds of change a request's rewrite (and its compaction) makes, as the inspector's records
//! store them (`"kind": "pruned"`) and its pages show them.

use serde::{Deserialize, Serialize};

/// One kind of change to a request's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// Old tool outputs replaced by the placeholder.
    Pruned,
    /// Long tool outputs cut to head and tail.
    Truncated,
    /// Repeated tool outputs pointed at their first copy.
    Deduplicated,
    /// Tool calls without results (or results without calls) repaired.
    Repaired,
    /// The older conversation replaced by a compaction's summary.
    Summarized,
}

impl ChangeKind {
    /// Every kind, in the order a request's changes are listed.
    pub const ALL: [ChangeKind; 5] = [
        ChangeKind::Pruned,
        ChangeKind::Truncated,
        ChangeKind::Deduplicated,
        ChangeKind::Repaired,
        ChangeKind::Summarized,
    ];

    /// The name stored and shown (its serde name too).
    pub fn label(self) -> &'static str {
        match self {
            ChangeKind::Pruned => "pruned",
            ChangeKind::Truncated => "truncated",
            ChangeKind::Deduplicated => "deduplicated",
            ChangeKind::Repaired => "repaired",
            ChangeKind::Summarized => "summarized",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_stored_under_the_name_it_is_shown_by() {
        for kind in ChangeKind::ALL {
            let stored = serde_json::to_string(&kind).unwrap();
            assert_eq!(stored, format!("\"{}\"", kind.label()));
            assert_eq!(serde_json::from_str::<ChangeKind>(&stored).unwrap(), kind);
        }
    }
}
