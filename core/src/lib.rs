//! snowid's decisions, in plain Rust with no PostgreSQL in them: the id layout, the server's
//! clocks, the generator and its stamp, the lease rules, and the grant rule that every registry
//! runs. The extension (`snowid`, with pgrx) and the model checker (`tests/model.rs`) use the same
//! code. docs/protocol.md says which rule lives in which function.

pub mod clock;
pub mod defects;
pub mod generator;
pub mod grant;
pub mod hash;
pub mod layout;
pub mod lease;
pub mod refusals;
pub mod trusted_clock;
