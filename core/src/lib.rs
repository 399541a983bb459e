//! `redislock-core`: the lock module's logic, with no Redis in it.
//!
//! Everything here is pure — time is passed in as `now_ms`, nothing opens a
//! key or replies to a client except through the [`orchestrate::Host`]
//! trait — so it is unit-tested without a server and model-checked by
//! `model/`, which implements that trait on its own state. The module crate at the root is the glue that
//! runs it inside `redis-server`.
//!
//! | module | what lives there |
//! |---|---|
//! | [`args`] | argument vectors → typed requests, every rule of the order of checks |
//! | [`limits`] | the grammar's limits (`ttl-ms`, owner length, `min-fence` reach) |
//! | [`error`] | the one error enum and its reply texts |
//! | [`lock`] | the one state machine for every mode: acquire, reenter, release, renew, fence, revocable, decided on a `Copy` view ([`lock::Seen`]); lease end, TTL fixes |
//! | [`holds`] | a lock's holds listed by owner, of either mode (exclusive, or shared up to a limit): storage whose changes [`lock`] decides |
//! | [`shared_queue`] | which waiting requests of either mode a lock grants now: from the head, each decided by [`lock::acquire`], shared ones together up to the limit, an exclusive one alone |
//! | [`fence`] | fencing tokens `max(last + 1, unix_ms × 2^10)` |
//! | [`queue`] | the FIFO of clients waiting on each lock |
//! | [`handoff`] | the hand-off engine: who gets a freed lock, timers, pauses, revokes |
//! | [`orchestrate`] | the sequencing around them, over a [`orchestrate::Host`]: acquire (grant, park or nil), serve, hand over, revoke, the pump, lease checks |
//! | [`owner`] | owner tokens of the usual forms (`<uuid>:<thread>`, `<hex>:<n>`, …) in fewer bytes, and back to the same text |
//! | [`quarantine`] | no fresh hold for `lock.max-ttl` ms after a start or a promotion (plus the replicas' lag after a promotion) |
//! | [`partition`] | the replicas gate: no grant where Redis would refuse writes for lack of replicas, nor until they are seen following again |
//! | [`cluster`] | hash slots and where a migrated key went |
//! | [`ephemeral`] | which connection each `EPHEMERAL` hold is bound to, indexed by client and by lock |
//! | [`histogram`] | latency histograms (log-linear, within 1%) for `INFO lock`'s `wait_usec` and `hold_usec` |
//! | [`latency`] | how long waits and holds granted here last, recorded in those histograms |
//! | [`stats`] | counters for `INFO lock` |
//! | [`planted`] | which clock a host's lease decisions read, and the flaw the model checks plant there (wall time, behind a test-only feature) |

pub mod args;
pub mod cluster;
pub mod ephemeral;
pub mod error;
pub mod fence;
pub mod handoff;
pub mod histogram;
pub mod holds;
pub mod latency;
pub mod limits;
pub mod lock;
pub mod orchestrate;
pub mod owner;
pub mod partition;
pub mod planted;
pub mod quarantine;
pub mod queue;
pub mod shared_queue;
pub mod stats;
