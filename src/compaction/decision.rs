//! The decisions compaction makes, as types: what starts a compaction, why a request is left
//! alone, how a compaction, a background summary or a prefill ended. Each renders, with
//! `label()`, exactly the string the metrics, the log lines and the stored records carry.

/// What started a compaction (the `trigger` metric label, `CompactionRecord.trigger`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The conversation's estimate passed the compaction threshold.
    Threshold,
    /// An operator asked for it (`POST /admin/sessions/{key}/compact`).
    Admin,
    /// The provider refused the request as too long (a rung of the overflow ladder).
    Overflow,
    /// A summary prepared in the background, ahead of the crossing its growth foresaw.
    Background,
}

impl Trigger {
    pub fn label(self) -> &'static str {
        match self {
            Trigger::Threshold => "threshold",
            Trigger::Admin => "admin",
            Trigger::Overflow => "overflow",
            Trigger::Background => "background",
        }
    }
}

/// Why a request goes as it came, without a rewrite (the `outcome` of `compactor_rewrites_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Untouched {
    /// Its rewrite ran out of its CPU budget.
    OverBudget,
    /// Too many messages or parts for the parse's memory bound.
    OverParseMemory,
    /// Not a body of its endpoint's dialect compactor can parse.
    Unparsed,
    /// A Responses request whose history is stored upstream (`previous_response_id`,
    /// `conversation`): compactor cannot see it.
    Stateful,
    /// The agent is summarizing its own history: compactor stays out of its way.
    AgentCompaction,
    /// The client asked for it (`bypass.header`).
    Bypass,
}

impl Untouched {
    pub fn label(self) -> &'static str {
        match self {
            Untouched::OverBudget => "over_budget",
            Untouched::OverParseMemory => "over_parse_memory",
            Untouched::Unparsed => "unparsed",
            Untouched::Stateful => "stateful",
            Untouched::AgentCompaction => "agent_compaction",
            Untouched::Bypass => "bypass",
        }
    }
}

/// How a compaction ended (the `outcome` of `compactor_compactions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionOutcome {
    /// A record was made (or another request's reused).
    Summarized,
    /// Pruning harder was enough: no summary call.
    Pruned,
    Failed,
}

impl CompactionOutcome {
    pub fn label(self) -> &'static str {
        match self {
            CompactionOutcome::Summarized => "summarized",
            CompactionOutcome::Pruned => "pruned",
            CompactionOutcome::Failed => "failed",
        }
    }
}

/// What became of a summary prepared in the background (the `outcome` of
/// `compactor_background_summaries_total` and of its tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackgroundOutcome {
    Started,
    /// Its record is stored, waiting for the request that needs it.
    Ready,
    /// Another request's job prepares (or prepared) the same crossing's record.
    Busy,
    /// Nothing to summarize.
    Nothing,
    Failed,
    /// A request applied its record.
    Used,
    /// A compaction on a request's path replaced it before any request applied it.
    Unneeded,
}

impl BackgroundOutcome {
    pub fn label(self) -> &'static str {
        match self {
            BackgroundOutcome::Started => "started",
            BackgroundOutcome::Ready => "ready",
            BackgroundOutcome::Busy => "busy",
            BackgroundOutcome::Nothing => "nothing",
            BackgroundOutcome::Failed => "failed",
            BackgroundOutcome::Used => "used",
            BackgroundOutcome::Unneeded => "unneeded",
        }
    }
}

/// How a prefill of a prepared summary ended (the `outcome` of `compactor_prefills_ahead_total`
/// and of its log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillOutcome {
    Sent,
    /// Another request of the conversation arrived first: nothing sent.
    MovedOn,
    Failed,
}

impl PrefillOutcome {
    pub fn label(self) -> &'static str {
        match self {
            PrefillOutcome::Sent => "sent",
            PrefillOutcome::MovedOn => "moved_on",
            PrefillOutcome::Failed => "failed",
        }
    }
}
