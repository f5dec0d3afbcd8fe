//! The one commit of a request's changes, awaited by its finisher (or done in place for the
//! in-process store), and every store failure reported with the session key and counted.

use tracing::Instrument;

use super::{STORE_WARNINGS, SessionCtx};
use crate::error::Chain;
use crate::session::error::StoreError;
use crate::session::state::{SessionUpdate, Update};
use crate::telemetry::{metric, trace};

impl SessionCtx {
    /// A request the upstream did not answer takes back its turn ([`SessionCtx::note_status`]).
    fn uncount_unanswered(&mut self) {
        if !self.answered {
            self.pending.conversation.run = None;
            self.pending.model_run = None;
        }
    }

    /// What a commit writes: what the session learned of its model, under the model's key (for
    /// the model's next sessions too), and this request's changes, under the session's; each
    /// `None` when there is nothing to write or another schema version owns the place.
    fn commit_writes(&self) -> (Option<(&str, SessionUpdate)>, Option<&Update>) {
        if self.pending.is_empty() {
            return (None, None);
        }
        let learned = match (&self.pending.session.learned, &self.model) {
            (Some(learned), Some(model)) if !self.foreign_model => {
                let update = SessionUpdate { learned: Some(learned.clone()), ..SessionUpdate::default() };
                Some((model.store_key.as_str(), update))
            }
            _ => None,
        };
        (learned, (!self.foreign_session).then_some(&self.pending))
    }

    /// Writes what this request added, once its response is done. False when the write failed
    /// (reported).
    pub async fn commit(mut self) -> bool {
        self.uncount_unanswered();
        let (learned, changes) = self.commit_writes();
        if let Some((model_key, update)) = learned
            && let Err(error) = self.store.update_session(model_key, &update).await
        {
            self.report(&error, "commit");
        }
        match changes {
            Some(update) => self.write(update, "commit").await,
            None => true,
        }
    }

    /// Whether [`SessionCtx::commit_in_place`] will do: the store is the in-process one.
    pub fn commits_in_place(&self) -> bool {
        self.store.is_in_process()
    }

    /// [`SessionCtx::commit`] for the in-process store, done at once on this thread (a map update
    /// that neither waits nor fails, so the request needs no finisher task). False, with nothing
    /// written, for any other store.
    pub fn commit_in_place(mut self) -> bool {
        self.uncount_unanswered();
        let (learned, changes) = self.commit_writes();
        if let Some((model_key, update)) = learned {
            self.store.update_session_in_place(model_key, &update);
        }
        let Some(update) = changes else { return true };
        let span = trace::stage("compactor.store.write", self.key.as_str());
        span.record("compactor.operation", "commit");
        let _entered = span.enter();
        self.store.update_in_place(self.key.as_str(), self.conversation_id.as_str(), update)
    }

    pub(super) async fn write(&self, update: &Update, operation: &'static str) -> bool {
        let span = trace::stage("compactor.store.write", self.key.as_str());
        span.record("compactor.operation", operation);
        let written =
            self.store.update(self.key.as_str(), self.conversation_id.as_str(), update).instrument(span.clone()).await;
        match written {
            Ok(()) => true,
            Err(error) => {
                span.record("otel.status_code", "ERROR");
                self.report(&error, operation);
                false
            }
        }
    }

    pub(super) fn report(&self, error: &StoreError, operation: &'static str) {
        if matches!(error, StoreError::CircuitOpen) {
            // The breaker said why when it opened; a skip is counted, not warned about again.
            metric::store_skipped(operation);
            return;
        }
        metric::store_error(operation);
        if STORE_WARNINGS.ready() {
            tracing::warn!(
                session = %self.key.as_str(),
                conversation = %self.conversation_id,
                operation = %operation,
                error = %Chain(error),
                "session store failed"
            );
        }
    }
}
