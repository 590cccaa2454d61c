//! The lease on a worker id: its timing rules, what the lease worker reports, and the SQL it runs.
//!
//! A server may issue under worker id W only while it holds W's row in the registry table
//! `snowid.worker_lease`. The worker claims the row for a time-to-live and renews it every third of
//! that. Two rules keep ids unique whatever the clocks and the network do:
//!
//! - **Deadline.** Issuing stops a sixth of the time-to-live before the lease could end, counted on
//!   this machine's monotonic clock from the moment the claim was *sent*: the registry grants at
//!   least that much later, so no clock difference between servers can stretch the lease.
//! - **Reservation.** Every claim also records in the row a high-water mark: a millisecond that this
//!   holder's ids stay below (its clock now plus the time-to-live). The next holder of W, whoever it
//!   is and whenever it comes, starts at that mark. Even a holder that kept issuing past the end of
//!   its lease could not repeat an id of the next one.
//!
//! A clean shutdown releases the row and lowers the mark to just above the last id really issued, so
//! a restarted server issues at once. After a crash the mark stays; the restarted server starts above
//! the ceiling it recorded in its own data directory (see `ceiling`) when the row shows that nobody
//! else held the worker id since, and above the mark otherwise.
//!
//! **Who may take a row.** From a registry inside this server's own data directory, a row held by
//! this server is taken back at once, by a new run of it too. From a shared registry, a free row is
//! anyone's, and a row held by another server, or by another run of this one, is taken once its
//! lease expired: a run that holds it may be a copy of this server (a cloned machine), and the two
//! must not take it from each other at every claim. The registry inside this server's own data
//! directory cannot see another server's renewals (the other may be the original of which this data
//! directory is a copy): there a row held by another server waits for an operator to hand it over (`snowid_handover`), and a
//! released row goes only to the server that released it, to one with another system identifier
//! (pg_upgrade) or on a later timeline (a promoted standby), never to a copy of the releaser.

mod claim;
mod sql;
mod status;
mod timing;
mod wording;

pub use claim::*;
pub use sql::*;
pub use status::*;
pub use timing::*;
pub use wording::*;
