//! A flaw the model checks plant in a host's clock to show they catch it
//! (the flaws of the queue's rule and of the sequencing sit beside the code
//! they break: [`crate::shared_queue::planted`], [`crate::orchestrate::planted`]).
//!
//! Every lease decision reads the host's clock ([`crate::orchestrate::Host::now`]
//! and `key_now`), and the contract says it is the lease clock: elapsed
//! time, which a step of the server's wall clock does not move. A host
//! that has both clocks (the model's server, which steps its wall clock)
//! picks the one its decisions read with [`lease_decisions_read`]: with the
//! `planted-flaw` feature (which only the model's tests turn on) and
//! [`LEASES_ON_WALL_CLOCK`] set, the wall clock, as a module that took the
//! server's wall time for its leases would. Without the feature it is the
//! lease clock, always.

#[cfg(feature = "planted-flaw")]
pub static LEASES_ON_WALL_CLOCK: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// The time a lease decision reads, given both clocks (unix ms): the lease
/// clock, unless the flaw is planted.
#[inline(always)]
pub fn lease_decisions_read(lease_ms: u64, wall_ms: u64) -> u64 {
    #[cfg(feature = "planted-flaw")]
    if LEASES_ON_WALL_CLOCK.load(std::sync::atomic::Ordering::Relaxed) {
        return wall_ms;
    }
    let _ = wall_ms;
    lease_ms
}
