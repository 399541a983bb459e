//! Serving one lock's queue of waiting requests of either mode.
//!
//! Pure, time passed in as `now_ms`, over [`Holds`]. When holds end, the
//! queue is served from its head for as long as the head can be granted:
//! shared requests at the head are granted together, up to the limit; an
//! exclusive request at the head waits until every hold has ended, and the
//! requests behind it wait behind it. So nobody barges past a waiter, and a
//! stream of readers cannot starve a writer: once the writer is at the head,
//! the readers that came after it wait until it has had the lock.
//!
//! The hand-off engine keeps the queue (ids, tombstones, timers) and calls
//! [`serve`] with its live waiters in order; it answers each
//! [`Served`] request and takes it out of the queue. A limit that differs
//! from the lock's or from a waiting request's is refused when the request
//! is made ([`Holds::check_limit`]), so every shared request in a queue has
//! the same limit; should one not, it only waits until the holds of the
//! other limit have ended, and is never granted beside them.

use crate::error::LockError;
use crate::holds::{Holds, Mode};
use crate::lock::{Acquire, Barriers, Hold};

/// A request waiting on the lock, as the queue rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a, Id> {
    /// The caller's handle for it (a client id).
    pub id: Id,
    pub owner: &'a [u8],
    pub mode: Mode,
    /// The semaphore's permits it asks for (1 but with `PERMITS`).
    pub permits: u32,
    /// The lease a grant gives, from `now_ms` (the caller caps it).
    pub ttl_ms: u64,
}

/// How a served request is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A new hold, with a new fence.
    Fresh(Hold),
    /// Its owner held the lock by the time the request reached the head
    /// (another connection of the same owner was granted ahead of it): a
    /// reentry, as the request would have been had it come then — count
    /// + 1, lease reset, same fence.
    Reentered(Hold),
    /// Refused as it would have been had it come then: the owner of a
    /// shared hold asking for an exclusive one ([`LockError::Upgrade`]), or
    /// a count that would overflow.
    Refused(LockError),
}

/// A request taken off the head of the queue, and its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served<Id> {
    pub id: Id,
    pub answer: Answer,
}

/// Serves the queue (`waiting`, oldest first) at `now_ms`: answers requests
/// from the head for as long as the head can be granted, applies each
/// answer to `holds`, and returns them in queue order — always a prefix of
/// the queue. `issue_fence` is called once per fresh hold, in queue order.
///
/// Only the prefix is read: `waiting` may be a lazy walk over a long queue.
/// Holds whose lease has ended are dropped by the first fresh grant
/// ([`Holds::begin`]) without a word: a caller that announces them (an
/// expiry event, a hold-time sample) calls [`Holds::drop_ended`] first.
pub fn serve<'a, Id>(
    holds: &mut Holds,
    waiting: impl IntoIterator<Item = Request<'a, Id>>,
    now_ms: u64,
    mut issue_fence: impl FnMut() -> u64,
) -> Vec<Served<Id>> {
    let mut served = Vec::new();
    for request in waiting {
        // Decided as `LOCK.ACQUIRE` decides it had the request come now,
        // with nobody ahead: the queue is what was ahead.
        let decision = holds.apply_permits(
            request.owner,
            (request.mode, request.permits),
            request.ttl_ms,
            now_ms,
            Barriers::NONE,
            &mut issue_fence,
        );
        let answer = match decision {
            Ok(Acquire::Fresh(hold)) => Answer::Fresh(hold),
            Ok(Acquire::Reentered(hold)) => Answer::Reentered(hold),
            Err(error) => Answer::Refused(error),
            Ok(Acquire::Busy) if planted::serves_past(request.mode) => continue,
            Ok(Acquire::Busy) => break,
        };
        served.push(Served {
            id: request.id,
            answer,
        });
    }
    served
}

/// A flaw the model checks plant in [`serve`] to show they catch it: with
/// the `planted-flaw` feature (which only the model's tests turn on) and
/// its switch set, a busy exclusive request at the head no longer stops the
/// serve, so shared requests behind it are granted past it. Without the
/// feature the check is a constant `false`.
pub mod planted {
    use crate::holds::Mode;

    #[cfg(feature = "planted-flaw")]
    pub static SERVE_PAST_A_WRITER: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);

    /// Whether the serve goes on past a busy request in `mode`.
    #[inline(always)]
    pub(crate) fn serves_past(mode: Mode) -> bool {
        #[cfg(feature = "planted-flaw")]
        {
            mode == Mode::Exclusive
                && SERVE_PAST_A_WRITER.load(std::sync::atomic::Ordering::Relaxed)
        }
        #[cfg(not(feature = "planted-flaw"))]
        {
            let _ = mode;
            false
        }
    }
}

/// The mode of the first shared request waiting, if any: the limit a new
/// shared request must match (the `waiting` argument of
/// [`Holds::acquire`]).
pub fn waiting_shared_mode<'a, Id: 'a>(
    waiting: impl IntoIterator<Item = &'a Request<'a, Id>>,
) -> Option<Mode> {
    waiting
        .into_iter()
        .map(|request| request.mode)
        .find(|mode| matches!(mode, Mode::Shared { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holds::tests::{held, owners, NOW};

    #[test]
    fn permits_are_served_first_come_first_served_within_the_limit() {
        let sem = Mode::Shared { limit: Some(4) };
        let mut holds = Holds::free();
        let first = holds.apply_permits(b"a", (sem, 3), 100, NOW, Barriers::NONE, || 1);
        assert!(matches!(first, Ok(Acquire::Fresh(_))));
        let ask = |owner: &'static str, permits| Request {
            id: owner,
            owner: owner.as_bytes(),
            mode: sem,
            permits,
            ttl_ms: 100,
        };
        // Two permits do not fit beside three: the head waits, and the one
        // behind it, which would fit, waits behind it.
        let served = serve(&mut holds, [ask("big", 2), ask("small", 1)], NOW, || 2);
        assert!(served.is_empty(), "{served:?}");
        // Alone, one permit fits (3 + 1 = 4), a second does not.
        let served = serve(&mut holds, [ask("small", 1), ask("more", 1)], NOW, || 3);
        assert_eq!(served.iter().map(|s| s.id).collect::<Vec<_>>(), ["small"]);
        assert_eq!(holds.live_permits(NOW), 4);
        // The hold keeps its permits: a reentry asking for others is refused.
        let again = holds.apply_permits(b"a", (sem, 2), 100, NOW, Barriers::NONE, || 9);
        assert_eq!(again, Err(LockError::PermitsMismatch));
        let again = holds.apply_permits(b"a", (sem, 3), 100, NOW, Barriers::NONE, || 9);
        assert!(matches!(again, Ok(Acquire::Reentered(h)) if h.count == 2));
        // Its release gives its three permits back: the big one fits now.
        holds.release(b"a", true, NOW).expect("release");
        assert_eq!(holds.live_permits(NOW), 1);
        let served = serve(&mut holds, [ask("big", 2), ask("more", 1)], NOW, || 4);
        assert_eq!(served.len(), 2);
        assert_eq!(holds.live_permits(NOW), 4);
    }
    const SEM2: Mode = Mode::Shared { limit: Some(2) };
    const SEM3: Mode = Mode::Shared { limit: Some(3) };
    const W: Mode = Mode::Exclusive;
    const R: Mode = Mode::READ;

    /// A queue as (owner, mode), oldest first.
    type Waiting = Vec<(&'static str, Mode)>;

    /// A queue of (owner, mode); each request's id is its owner's name.
    fn queue<'a>(requests: &'a [(&'a str, Mode)]) -> Vec<Request<'a, &'a str>> {
        requests
            .iter()
            .map(|&(owner, mode)| Request {
                id: owner,
                owner: owner.as_bytes(),
                mode,
                permits: 1,
                ttl_ms: 100,
            })
            .collect()
    }

    /// Serves `waiting` at `now` with fences 100, 101…; returns the ids
    /// served (with `+` for a reentry and `!` for a refusal), and the fences.
    fn run(holds: &mut Holds, waiting: &[(&str, Mode)], now: u64) -> (Vec<String>, Vec<u64>) {
        let mut next = 99;
        let served = serve(holds, queue(waiting), now, || {
            next += 1;
            next
        });
        let mut ids = Vec::new();
        let mut fences = Vec::new();
        for Served { id, answer } in served {
            match answer {
                Answer::Fresh(hold) => {
                    ids.push(id.to_string());
                    fences.push(hold.fence);
                }
                Answer::Reentered(_) => ids.push(format!("{id}+")),
                Answer::Refused(_) => ids.push(format!("{id}!")),
            }
        }
        (ids, fences)
    }

    #[test]
    fn the_queue_is_served_from_its_head_while_the_head_can_be_granted() {
        let later = NOW + 1_000;
        let ended = NOW - 1;
        // (what holds the lock, the queue, who is served)
        let cases: Vec<(Holds, Waiting, Vec<&str>)> = vec![
            // Nobody waits: nothing to do.
            (Holds::free(), vec![], vec![]),
            // Readers at the head are granted together, up to the writer.
            (
                Holds::free(),
                vec![("r1", R), ("r2", R), ("r3", R), ("w", W), ("r4", R)],
                vec!["r1", "r2", "r3"],
            ),
            // A writer at the head of a free lock, alone; readers wait behind it.
            (
                Holds::free(),
                vec![("w", W), ("r1", R), ("r2", R)],
                vec!["w"],
            ),
            // Two writers: one at a time.
            (Holds::free(), vec![("w1", W), ("w2", W)], vec!["w1"]),
            // A writer between readers: the reader holding keeps the writer
            // waiting, and the reader behind it waits too (no barging).
            (held(R, &[("r0", later)]), vec![("w", W), ("r1", R)], vec![]),
            // The reader's lease ended: the writer, and only the writer.
            (
                held(R, &[("r0", ended)]),
                vec![("w", W), ("r1", R)],
                vec!["w"],
            ),
            // A reader joins readers that hold, when it is at the head.
            (
                held(R, &[("r0", later)]),
                vec![("r1", R), ("r2", R), ("w", W), ("r3", R)],
                vec!["r1", "r2"],
            ),
            // Held exclusively: nobody, in either mode.
            (held(W, &[("w0", later)]), vec![("r1", R), ("w", W)], vec![]),
            (held(W, &[("w0", later)]), vec![("w", W)], vec![]),
            // The writer's lease ended: the readers at the head.
            (
                held(W, &[("w0", ended)]),
                vec![("r1", R), ("r2", R), ("w", W)],
                vec!["r1", "r2"],
            ),
            // A semaphore: up to its limit, then the rest wait in order.
            (
                Holds::free(),
                vec![("a", SEM2), ("b", SEM2), ("c", SEM2), ("d", SEM2)],
                vec!["a", "b"],
            ),
            // One permit free: the next waiter gets it, the one after waits.
            (
                held(SEM2, &[("a", later), ("b", ended)]),
                vec![("c", SEM2), ("d", SEM2)],
                vec!["c"],
            ),
            (
                held(SEM2, &[("a", later), ("b", later)]),
                vec![("c", SEM2)],
                vec![],
            ),
            // A writer waiting on a semaphore holds back permits behind it.
            (
                held(SEM3, &[("a", later)]),
                vec![("w", W), ("b", SEM3)],
                vec![],
            ),
            // A request of another limit (refused when made, so it should
            // not be here) waits until the holds of the other limit end.
            (held(SEM3, &[("a", later)]), vec![("r", R)], vec![]),
            (held(SEM3, &[("a", ended)]), vec![("r", R)], vec!["r"]),
        ];
        for (mut holds, waiting, want) in cases {
            let before = holds.clone();
            let (got, _) = run(&mut holds, &waiting, NOW);
            assert_eq!(got, want, "{before:?} {waiting:?}");
            for id in &want {
                assert!(holds.of(id.as_bytes(), NOW).is_some(), "{id} holds");
            }
        }
    }

    #[test]
    fn each_fresh_grant_gets_the_next_fence_in_queue_order() {
        let mut holds = Holds::free();
        let (ids, fences) = run(&mut holds, &[("r1", R), ("r2", R), ("r3", R)], NOW);
        assert_eq!(ids, ["r1", "r2", "r3"]);
        assert_eq!(fences, [100, 101, 102]);
        assert_eq!(holds.mode(), R);
        assert_eq!(holds.highest_fence(NOW), Some(102));
    }

    #[test]
    fn leases_ending_out_of_order_free_one_permit_each() {
        // Two permits, held by "a" until +30 and "b" until +10; "c" and "d" wait.
        let mut holds = held(SEM2, &[("a", NOW + 30), ("b", NOW + 10)]);
        let waiting = [("c", SEM2), ("d", SEM2)];
        assert_eq!(run(&mut holds, &waiting, NOW + 10).0, Vec::<String>::new());
        // "b", second in the list, ends first: "c" gets its permit.
        assert_eq!(run(&mut holds, &waiting, NOW + 11).0, ["c"]);
        assert_eq!(owners(&holds, NOW + 11), ["a", "c"]);
        assert_eq!(holds.holders().len(), 2, "b's ended hold was dropped");
        // "c" now holds until +111; "a" ends at +31: "d" gets its permit.
        assert_eq!(run(&mut holds, &waiting[1..], NOW + 31).0, ["d"]);
        assert_eq!(owners(&holds, NOW + 31), ["c", "d"]);
    }

    #[test]
    fn a_writer_between_readers_goes_when_the_readers_ahead_have_gone() {
        let mut holds = held(R, &[("r1", NOW + 10), ("r2", NOW + 20)]);
        let waiting = [("w", W), ("r3", R)];
        // One reader's lease ends: the other still holds, the writer waits.
        assert!(run(&mut holds, &waiting, NOW + 11).0.is_empty());
        // The other releases: the writer, with a fence above both readers'.
        assert_eq!(holds.release(b"r2", false, NOW + 12), Ok(0));
        let (ids, fences) = run(&mut holds, &waiting, NOW + 12);
        assert_eq!((ids, fences), (vec!["w".to_string()], vec![100]));
        assert_eq!(holds.mode(), W);
        // The writer releases: the reader behind it.
        assert_eq!(holds.release(b"w", false, NOW + 13), Ok(0));
        assert_eq!(run(&mut holds, &waiting[1..], NOW + 13).0, ["r3"]);
        assert_eq!(holds.mode(), R);
    }

    #[test]
    fn a_waiter_whose_owner_holds_the_lock_by_then_reenters_or_is_refused() {
        let later = NOW + 1_000;
        // (what holds the lock, the queue, who is served: `+` a reentry,
        // `!` a refusal)
        let cases: Vec<(Holds, Waiting, Vec<&str>)> = vec![
            // Two connections of one reader: granted, then reentered.
            (
                Holds::free(),
                vec![("x", R), ("x", R), ("y", R)],
                vec!["x", "x+", "y"],
            ),
            // A writer's second connection, in either mode: a reentry (a
            // writer may read), and the reader behind still waits.
            (
                Holds::free(),
                vec![("x", W), ("x", R), ("y", R)],
                vec!["x", "x+"],
            ),
            (
                Holds::free(),
                vec![("x", W), ("x", W), ("y", W)],
                vec!["x", "x+"],
            ),
            (held(W, &[("x", later)]), vec![("x", R)], vec!["x+"]),
            // A reader's second connection asks to write: an upgrade,
            // refused, and serving goes on past it.
            (
                Holds::free(),
                vec![("x", R), ("x", W), ("y", R)],
                vec!["x", "x!", "y"],
            ),
            // A semaphore full of its own owner's permits: a reentry takes
            // no permit.
            (
                held(SEM2, &[("x", later), ("y", later)]),
                vec![("x", SEM2), ("z", SEM2)],
                vec!["x+"],
            ),
            // Its own hold ended meanwhile: a fresh hold, if the lock admits it.
            (held(W, &[("x", NOW - 1)]), vec![("x", W)], vec!["x"]),
            (
                held(R, &[("x", NOW - 1), ("y", later)]),
                vec![("x", W)],
                vec![],
            ),
        ];
        for (mut holds, waiting, want) in cases {
            let before = holds.clone();
            let (got, _) = run(&mut holds, &waiting, NOW);
            assert_eq!(got, want, "{before:?} {waiting:?}");
        }
    }

    #[test]
    fn a_reentry_from_the_queue_counts_and_keeps_the_fence() {
        let mut holds = Holds::free();
        let served = serve(&mut holds, queue(&[("x", W), ("x", R)]), NOW, || 7);
        let answers: Vec<Answer> = served.iter().map(|s| s.answer).collect();
        let hold = |count| Hold {
            count,
            fence: 7,
            expires_at: NOW + 100,
        };
        assert_eq!(
            answers,
            [Answer::Fresh(hold(1)), Answer::Reentered(hold(2))]
        );
        assert_eq!(holds.release(b"x", false, NOW), Ok(1));
        assert_eq!(holds.release(b"x", false, NOW), Ok(0));
        assert!(holds.is_free(NOW));
    }

    #[test]
    fn only_the_prefix_served_is_read() {
        let mut holds = held(W, &[("w", NOW + 10)]);
        let mut read = 0;
        let requests = queue(&[("a", R), ("b", R), ("c", R)]);
        let walk = requests.iter().inspect(|_| read += 1).copied();
        assert!(serve(&mut holds, walk, NOW, || 1).is_empty());
        assert_eq!(read, 1, "the blocked head is as far as it looks");
    }

    #[test]
    fn the_limit_a_new_shared_request_must_match_is_the_first_shared_waiters() {
        let cases: Vec<(Waiting, Option<Mode>)> = vec![
            (vec![], None),
            (vec![("w", W)], None),
            (vec![("w", W), ("a", SEM3), ("b", SEM3)], Some(SEM3)),
            (vec![("r", R)], Some(R)),
        ];
        for (waiting, want) in cases {
            let requests = queue(&waiting);
            assert_eq!(waiting_shared_mode(&requests), want, "{waiting:?}");
        }
    }

    #[test]
    fn another_limit_is_refused_when_asked_so_the_queue_never_holds_two() {
        let waiters = Barriers {
            waiters: true,
            ..Barriers::NONE
        };
        // Held by a writer; a writer and a permit of 3 wait.
        let mut holds = held(W, &[("w0", NOW + 1_000)]);
        let requests = queue(&[("w", W), ("a", SEM3)]);
        let waiting = waiting_shared_mode(&requests);
        // (the request, refused?)
        let cases = [(R, true), (SEM2, true), (SEM3, false), (W, false)];
        for (mode, refused) in cases {
            let before = holds.clone();
            let got = holds.acquire(b"x", mode, 50, NOW, waiters, waiting, || 9);
            let want = if refused {
                Err(LockError::LimitMismatch)
            } else {
                Ok(crate::lock::Acquire::Busy)
            };
            assert_eq!(got, want, "{mode:?}");
            assert_eq!(holds, before, "{mode:?} changes nothing");
        }
    }
}
