//! The inspector logins ended by "Log out", for the in-process store: each kept until the login
//! would have expired, and at most [`MAX_LOGOUTS`] of them. The shared store keeps the same list
//! in Redis ([`super::redis`]), so every replica honors a logout.

use std::collections::HashMap;

/// Ended logins kept at most. Past it, with none of them expired, every login that expires no
/// later than the newest ended one is ended with it: the admins log in again, and no ended login
/// is ever good again because the list was full.
pub const MAX_LOGOUTS: usize = 4_096;

/// Ended logins by their id (a keyed hash of the cookie), with when each would have expired.
#[derive(Debug, Default)]
pub struct Logouts {
    ended: HashMap<String, u64>,
    /// Every login expiring at or before this Unix second is ended (set when the list was full).
    all_until: u64,
}

impl Logouts {
    /// Ends the login `id`, good until Unix second `expires`, at `now`.
    pub fn end(&mut self, id: &str, expires: u64, now: u64) {
        if expires <= now || expires <= self.all_until {
            return;
        }
        if self.ended.len() >= MAX_LOGOUTS {
            self.ended.retain(|_, until| *until > now);
        }
        if self.ended.len() >= MAX_LOGOUTS {
            // Logins expire LOGIN_SECS after they are made: this ends the logins made up to the
            // newest ended one, a few more than were logged out, never fewer.
            let newest = self.ended.values().copied().max().unwrap_or(0);
            self.all_until = newest.max(expires);
            self.ended.clear();
            return;
        }
        self.ended.insert(id.to_string(), expires);
    }

    /// Whether the login `id`, good until `expires`, was ended, at `now`.
    pub fn ended(&self, id: &str, expires: u64, now: u64) -> bool {
        expires <= self.all_until || self.ended.get(id).is_some_and(|until| *until > now)
    }

    /// Logins held in the list.
    pub fn len(&self) -> usize {
        self.ended.len()
    }

    /// Whether the list holds no login.
    pub fn is_empty(&self) -> bool {
        self.ended.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_login_stays_ended_until_it_would_have_expired_and_the_others_stay_good() {
        let mut logouts = Logouts::default();
        logouts.end("a", 100, 10);
        assert!(logouts.ended("a", 100, 50));
        assert!(!logouts.ended("b", 100, 50), "another login is not ended");
        // Once expired the cookie is refused anyway: its entry goes when room is needed.
        assert!(!logouts.ended("a", 100, 100));
        logouts.end("expired already", 5, 10);
        assert_eq!(logouts.len(), 1, "a login past its expiry is not kept");
    }

    #[test]
    fn a_full_list_drops_the_expired_first_then_ends_every_older_login_rather_than_forget_one() {
        let mut logouts = Logouts::default();
        for k in 0..MAX_LOGOUTS as u64 {
            logouts.end(&format!("old {k}"), 100 + k, 0);
        }
        assert_eq!(logouts.len(), MAX_LOGOUTS);
        // At 100 the first login has expired: its room is taken again.
        logouts.end("next", 10_000, 100);
        assert_eq!(logouts.len(), MAX_LOGOUTS);
        assert!(logouts.ended("next", 10_000, 100));
        // Full of live logins: every login expiring by the newest ended one ends, none is forgotten.
        logouts.end("over", 20_000, 100);
        assert!(logouts.is_empty());
        for (id, expires) in [("old 4000", 4_100), ("next", 10_000), ("over", 20_000), ("not logged out", 19_999)] {
            assert!(logouts.ended(id, expires, 101), "{id}");
        }
        assert!(!logouts.ended("made after", 20_001, 101), "a login made after the newest logout stays good");
    }
}
