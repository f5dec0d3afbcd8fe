//! Sessions: which conversation a request belongs to, and the state compactor keeps for it so the
//! next request of the same conversation gets the same rewrite, on any replica.

pub mod ctx;
pub mod error;
pub mod identify;
pub mod memory;
pub mod redis;
pub mod state;
pub mod store;

pub use ctx::SessionCtx;
pub use error::StoreError;
pub use identify::{Identifier, SessionKey, SessionSource};
pub use state::{SessionState, SessionUpdate, Usage};
pub use store::Store;
