//! Defects snowid once had, each a switch at the line that fixed it, so that the model checker can
//! show it finds every one (`tests/model.rs`, docs/protocol.md's catalogue). Only the test-only
//! feature `known-defects` can turn one on; without it `on` is a constant `false` and the switch
//! compiles away.

/// One known defect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Defect {
    /// etcd in 0.9.0: a claim by a holder's word where its keys are gone was granted without
    /// comparing the mark with the marks that run knows of.
    WordWithoutMark = 1,
    /// 0.8.0: a PostgreSQL registry whose lease row was deleted by hand began no epoch, and granted
    /// the worker id at once above a mark of 0. The epoch's beginning is SQL (`snowid.lease_changed`
    /// since 0.9.0): the switch is in the model checker's re-statement of it.
    DeletedRowForgotten = 2,
    /// 0.2.0: with the lease table on the server, a row released at a clean shutdown was granted to
    /// a copy of that server's data directory (a cold backup started beside it); 0.2.0 recorded
    /// no releaser.
    ReleasedRowTakenByACopy = 16,
    /// 0.8.0: a renewal whose first answer was lost applied no floor.
    RenewalWithoutFloor = 4,
    /// 0.9.0: etcd, a grant was not judged again after its transaction, and etcd restored between
    /// the claim's judgement of its history and its read of the keys went unnoticed. The judgement
    /// lives in the extension's etcd transport (`claims.rs` `try_claim`): the switch is in the
    /// model checker's re-statement of it.
    TakeUnjudgedAfterRestore = 32,
    /// 0.9.0: with `snowid.any_worker_id`, a grant of another worker id than the one the server
    /// last issued under started above that worker id's mark only, not above the server's own
    /// ids: after a restart of the machine and a clock set back, its ids went back.
    OtherWorkerCeilingIgnored = 64,
    /// 0.8.0: a change of the gate (a new grant, a closing) did not fence a claim that had read
    /// the gate before it: a caller held between its look and its swap issued under a grant no
    /// longer in force, or above the bound a closing answered.
    GateChangeUnfenced = 128,
    /// 0.7.0: a PostgreSQL registry restored from a backup began no epoch (`snowid.registry_epoch`
    /// since 0.8.0). The switch is in the model checker, as above.
    RestoreUnnoticed = 8,
}

#[cfg(feature = "known-defects")]
static ON: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Whether `defect` is switched on.
#[inline(always)]
pub fn on(defect: Defect) -> bool {
    #[cfg(feature = "known-defects")]
    {
        ON.load(std::sync::atomic::Ordering::Relaxed) & defect as u32 != 0
    }
    #[cfg(not(feature = "known-defects"))]
    {
        let _ = defect;
        false
    }
}

/// Switches on exactly `defects` (none with an empty slice), for the model checker.
#[cfg(feature = "known-defects")]
pub fn switch_on(defects: &[Defect]) {
    let bits = defects.iter().fold(0, |bits, &defect| bits | defect as u32);
    ON.store(bits, std::sync::atomic::Ordering::Relaxed);
}
