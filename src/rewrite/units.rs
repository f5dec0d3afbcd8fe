//! The two units a prompt's size is counted in. compactor's own estimate ([`Estimated`]: its
//! tokenizer's count with the model's vendor factor applied) is what the rewrite reports; the
//! provider's tokenizer ([`ProviderTokens`]) is what windows, usage reports and overflow errors
//! are in. The one way from one to the other is the session's calibration
//! (`compaction::Pressure::calibrated` and `uncalibrated`): neither converts into the other.

use std::fmt;
use std::ops::{Add, Mul};

/// Tokens as compactor estimates them (vendor factor applied, not calibrated).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Estimated(u64);

/// Tokens as the provider counts them (a window, a usage report, an estimate calibrated).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProviderTokens(u64);

macro_rules! unit {
    ($unit:ident) => {
        impl $unit {
            pub const ZERO: $unit = $unit(0);

            pub const fn new(tokens: u64) -> Self {
                Self(tokens)
            }

            /// The bare count, for a header, a log field, a metric or a stored field.
            pub const fn get(self) -> u64 {
                self.0
            }

            pub fn saturating_sub(self, other: Self) -> Self {
                Self(self.0.saturating_sub(other.0))
            }

            pub fn saturating_add(self, other: Self) -> Self {
                Self(self.0.saturating_add(other.0))
            }

            /// This many, `times` over (turns like the newest).
            pub fn saturating_mul(self, times: u64) -> Self {
                Self(self.0.saturating_mul(times))
            }

            /// The count as a `u32` field, saturated.
            pub fn as_u32(self) -> u32 {
                u32::try_from(self.0).unwrap_or(u32::MAX)
            }
        }

        impl Add for $unit {
            type Output = $unit;
            fn add(self, other: Self) -> Self {
                Self(self.0 + other.0)
            }
        }

        impl Mul<u64> for $unit {
            type Output = $unit;
            fn mul(self, times: u64) -> Self {
                Self(self.0 * times)
            }
        }

        impl fmt::Display for $unit {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

unit!(Estimated);
unit!(ProviderTokens);

impl From<u32> for Estimated {
    /// A rewrite's report counts its estimates in `u32`.
    fn from(tokens: u32) -> Self {
        Self(u64::from(tokens))
    }
}
