//! A released lock is never seen free while clients wait (fair, prompt hand-off): a `LOCK.RELEASE` that frees a lock with waiters
//! hands it over inside the same command. No command that runs after it —
//! in the same pipeline, the same `MULTI`, or from another client — sees the
//! lock free: `LOCK.INFO` shows the new owner, `EXISTS` says 1, `SET NX`
//! fails. The release and the grant reach the AOF as one entry (the new
//! hold written over the released one), so no replay stops between them.
//!
//! Before this was fixed the hand-off waited for a 0 ms timer: the rest
//! of the pipeline saw the lock free, and the AOF held the release and the
//! grant as two separate entries.

use std::fs;
use std::thread::JoinHandle;
use std::time::Duration;

use redis::Value;

use crate::harness::{
    events_until, handed_fence, keyevent_listener, wait_on, wait_until, Call, LockInfo, Reply,
    Server, LONG,
};

/// How long a test waits for something that should happen at once.
const SOON: Duration = Duration::from_secs(5);

/// Alice holds `k`; bob waits on it (returned once `k` shows him waiting).
fn alice_holds_and_bob_waits(server: &Server) -> JoinHandle<Reply> {
    let mut c = server.conn();
    c.acquire("k", "alice", LONG).expect("k is free");
    let bob = wait_on(server.conn(), "k", "bob", LONG, 0);
    wait_until("bob waits on k", SOON, || {
        c.lock_info("k").is_some_and(|info| info.waiters == 1)
    });
    bob
}

/// The replies of `LOCK.RELEASE k alice`, `LOCK.INFO k`, `EXISTS k`,
/// `SET k x NX` sent together, and what each must be: the release frees
/// the lock and hands it to bob before the next command runs.
fn assert_bob_holds_right_after_the_release(replies: &[Value], bob: JoinHandle<Reply>, how: &str) {
    let [released, info, exists, set_nx] = replies else {
        panic!("{how}: four replies expected: {replies:?}");
    };
    assert_eq!(released, &Value::Int(0), "{how}: LOCK.RELEASE k alice");
    assert_ne!(
        info,
        &Value::Nil,
        "{how}: LOCK.INFO right after the release saw k free"
    );
    let info = LockInfo::from_reply(info).unwrap_or_else(|why| panic!("{how}: {why}: {info:?}"));
    assert_eq!(
        (info.owner.as_slice(), info.count, info.waiters),
        (&b"bob"[..], 1, 0),
        "{how}: LOCK.INFO right after the release"
    );
    assert_eq!(
        exists,
        &Value::Int(1),
        "{how}: EXISTS k right after the release"
    );
    assert_eq!(set_nx, &Value::Nil, "{how}: SET k x NX took the freed lock");
    let fence = handed_fence(bob, "bob");
    assert_eq!(fence, info.fence, "{how}: bob's fence and LOCK.INFO's");
}

/// The four commands of [`assert_bob_holds_right_after_the_release`].
fn release_then_look(pipe: &mut redis::Pipeline) -> &mut redis::Pipeline {
    pipe.cmd("LOCK.RELEASE")
        .arg(&["k", "alice"])
        .cmd("LOCK.INFO")
        .arg("k")
        .cmd("EXISTS")
        .arg("k")
        .cmd("SET")
        .arg(&["k", "x", "NX"])
}

/// in one pipeline, the commands after the release see bob's
/// hold, not a free lock.
#[test]
fn the_rest_of_the_pipeline_sees_the_waiter_hold_the_released_lock() {
    let server = Server::start();
    let bob = alice_holds_and_bob_waits(&server);
    let replies: Vec<Value> = release_then_look(&mut redis::pipe())
        .query(&mut server.conn())
        .expect("pipeline");
    assert_bob_holds_right_after_the_release(&replies, bob, "pipeline");
}

/// the same inside `MULTI`/`EXEC`.
#[test]
fn the_rest_of_the_transaction_sees_the_waiter_hold_the_released_lock() {
    let server = Server::start();
    let bob = alice_holds_and_bob_waits(&server);
    let replies: Vec<Value> = release_then_look(redis::pipe().atomic())
        .query(&mut server.conn())
        .expect("MULTI/EXEC");
    assert_bob_holds_right_after_the_release(&replies, bob, "MULTI/EXEC");
}

/// (A guard: the old module passed this one too, its 0 ms timer
/// firing before carol's turn): another client whose commands run right
/// after the release sees bob's hold. Carol is blocked in `BLPOP signal` with `LOCK.INFO k`
/// and `EXISTS k` pipelined behind it; the releasing client pushes to
/// `signal` right after `LOCK.RELEASE`, so carol's commands run next,
/// before anything else the server does.
#[test]
fn another_client_right_after_the_release_sees_the_waiter_hold_the_lock() {
    let server = Server::start();
    let bob = alice_holds_and_bob_waits(&server);
    let mut c = server.conn();
    let mut carol = server.conn();
    let packed = redis::pipe()
        .cmd("BLPOP")
        .arg(&["signal", "10"])
        .cmd("LOCK.INFO")
        .arg("k")
        .cmd("EXISTS")
        .arg("k")
        .get_packed_pipeline();
    carol
        .send_packed_command(&packed)
        .expect("send carol's pipeline");
    wait_until("carol blocks in BLPOP", SOON, || {
        c.info_int("clients", "blocked_clients") == 2
    });

    let (released, pushed): (i64, i64) = redis::pipe()
        .cmd("LOCK.RELEASE")
        .arg(&["k", "alice"])
        .cmd("LPUSH")
        .arg(&["signal", "go"])
        .query(&mut c)
        .expect("LOCK.RELEASE, LPUSH");
    assert_eq!((released, pushed), (0, 1));
    let mut next = || carol.recv_response().expect("carol's reply");
    let popped = next();
    assert!(
        matches!(&popped, Value::Array(items) if items.len() == 2),
        "BLPOP: {popped:?}"
    );
    let (info, exists) = (next(), next());
    assert_ne!(info, Value::Nil, "carol saw k free right after the release");
    let info = LockInfo::from_reply(&info).expect("LOCK.INFO");
    assert_eq!((info.owner.as_slice(), info.count), (&b"bob"[..], 1));
    assert_eq!(exists, Value::Int(1), "carol's EXISTS k");
    assert_eq!(handed_fence(bob, "bob"), info.fence);
}

/// The commands of an AOF, in order (RESP arrays of bulk strings).
pub(crate) fn aof_commands(bytes: &[u8]) -> Vec<Vec<Vec<u8>>> {
    fn line<'a>(bytes: &'a [u8], at: &mut usize) -> &'a [u8] {
        let end = bytes[*at..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .unwrap_or_else(|| panic!("AOF: no CRLF after byte {at}"));
        let line = &bytes[*at..*at + end];
        *at += end + 2;
        line
    }
    fn number(line: &[u8], kind: u8) -> usize {
        assert_eq!(
            line.first(),
            Some(&kind),
            "AOF: {:?}",
            line.escape_ascii().to_string()
        );
        std::str::from_utf8(&line[1..])
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("AOF: bad length {:?}", line.escape_ascii().to_string()))
    }
    let mut commands = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let args = number(line(bytes, &mut at), b'*');
        let command = (0..args)
            .map(|_| {
                let len = number(line(bytes, &mut at), b'$');
                let arg = bytes[at..at + len].to_vec();
                at += len + 2;
                arg
            })
            .collect();
        commands.push(command);
    }
    commands
}

/// The commands of `server`'s incremental AOF files (after the base a
/// rewrite wrote), in order.
pub(crate) fn aof_incr_commands(server: &Server) -> Vec<Vec<Vec<u8>>> {
    let dir = server.dir().join("appendonlydir");
    let mut incr: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a dir entry").path())
        .filter(|path| path.to_string_lossy().ends_with(".incr.aof"))
        .collect();
    incr.sort();
    assert!(!incr.is_empty(), "no .incr.aof in {}", dir.display());
    let bytes: Vec<u8> = incr
        .iter()
        .flat_map(|path| fs::read(path).expect("read the AOF"))
        .collect();
    aof_commands(&bytes)
}

/// An AOF's commands as the units a replay applies whole: a `MULTI` …
/// `EXEC` block, or a single command.
fn aof_units(commands: Vec<Vec<Vec<u8>>>) -> Vec<Vec<Vec<Vec<u8>>>> {
    let mut units = Vec::new();
    let mut open: Option<Vec<Vec<Vec<u8>>>> = None;
    for command in commands {
        let name = command.first().map(|n| n.to_ascii_uppercase());
        match (name.as_deref(), open.as_mut()) {
            (Some(b"MULTI"), _) => open = Some(Vec::new()),
            (Some(b"EXEC"), Some(_)) => units.extend(open.take()),
            (_, Some(block)) => block.push(command),
            (_, None) => units.push(vec![command]),
        }
    }
    units.extend(open);
    units
}

fn show(unit: &[Vec<Vec<u8>>]) -> String {
    unit.iter()
        .map(|command| {
            command
                .iter()
                .map(|arg| arg.escape_ascii().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// the release and the grant reach the AOF together: from the
/// entry that writes alice's acquisition to the one that writes bob's, every
/// entry about `k` is inside the grant's `MULTI` … `EXEC` (or the grant
/// alone replaces alice's hold). A replay never stops with `k` free while
/// bob was waiting.
#[test]
fn a_release_and_its_hand_off_reach_the_aof_in_one_transaction() {
    let server = Server::builder().appendonly(true).start();
    server.wait_for_aof_rewrite();
    let bob = alice_holds_and_bob_waits(&server);
    let mut c = server.conn();
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    let fence = handed_fence(bob, "bob");
    assert_eq!(
        c.lock_info("k").map(|i| i.held()),
        Some((b"bob".to_vec(), 1, fence))
    );

    // appendfsync always: every reply's effects were in the file first.
    let units = aof_units(aof_incr_commands(&server));

    let about_k = |command: &Vec<Vec<u8>>| command.get(1).is_some_and(|key| key == b"k");
    let names = |unit: &[Vec<Vec<u8>>], who: &[u8]| {
        unit.iter()
            .any(|command| about_k(command) && command[2..].iter().any(|arg| arg == who))
    };
    let grant = units
        .iter()
        .position(|unit| names(unit, b"bob"))
        .unwrap_or_else(|| panic!("no entry grants k to bob in the AOF:\n{units:#?}"));
    // Alice's only write before the release is her acquisition.
    let alice = units[..grant]
        .iter()
        .position(|unit| names(unit, b"alice"))
        .unwrap_or_else(|| panic!("no entry writes alice's hold before bob's grant"));
    let between: Vec<String> = units[alice + 1..grant]
        .iter()
        .filter(|unit| unit.iter().any(about_k))
        .map(|unit| show(unit))
        .collect();
    assert!(
        between.is_empty(),
        "the release reached the AOF apart from the grant ({}): {between:?}",
        show(&units[grant])
    );
    // Nothing in the grant's unit leaves k free at its end.
    let last_about_k = units[grant]
        .iter()
        .rev()
        .find(|command| about_k(command))
        .expect("the grant");
    assert!(
        last_about_k.iter().any(|arg| arg == b"bob"),
        "the grant's transaction ends with {}",
        show(std::slice::from_ref(last_about_k))
    );
    // One effect: the new hold written over the released one, with no
    // `DEL` and no transaction around it.
    let grant_unit = &units[grant];
    assert_eq!(grant_unit.len(), 1, "the hand-off: {}", show(grant_unit));
    assert!(
        grant_unit[0][0].eq_ignore_ascii_case(b"LOCK.APPLY"),
        "the hand-off: {}",
        show(grant_unit)
    );
}

#[test]
fn a_hand_off_is_announced_as_the_release_then_the_waiter_s_acquisition() {
    // The key goes from one holder to the next without being deleted: no
    // `del` (nor `new`) between the release and the acquisition; a release
    // nobody waits for still deletes the key.
    let server = Server::start();
    let mut c = server.conn();
    let _: () = c.value(&["CONFIG", "SET", "notify-keyspace-events", "Egxdn"]);
    let mut listener = keyevent_listener(&server);
    let bob = alice_holds_and_bob_waits(&server);
    assert_eq!(
        events_until(&mut listener, "k", "lock.acquire"),
        ["new", "lock.acquire"]
    );
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    handed_fence(bob, "bob");
    assert_eq!(
        events_until(&mut listener, "k", "lock.acquire"),
        ["lock.release", "lock.acquire"]
    );
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "bob"]), 0);
    assert_eq!(
        events_until(&mut listener, "k", "del"),
        ["lock.release", "del"]
    );
}

/// Alice holds `k`; bob waits on it from a connection the test will kill.
/// Returns a connection, bob's client id, and bob's thread, which gets the
/// error of his killed connection back.
fn alice_holds_and_killable_bob_waits(
    server: &Server,
) -> (
    redis::Connection,
    i64,
    JoinHandle<redis::RedisResult<Value>>,
) {
    let mut c = server.conn();
    c.acquire("k", "alice", LONG).expect("k is free");
    let mut b = server.conn();
    let bob_id = b.int(&["CLIENT", "ID"]);
    let bob = std::thread::spawn(move || {
        redis::cmd("LOCK.ACQUIRE")
            .arg(&["k", "bob", &LONG.to_string(), "WAIT", "0"])
            .query::<Value>(&mut b)
    });
    wait_until("bob waits on k", SOON, || {
        c.lock_info("k").is_some_and(|info| info.waiters == 1)
    });
    (c, bob_id, bob)
}

/// A grant is taken back only while it is still the hold the waiter was
/// given. Here bob is granted `k` by the release, another connection of the
/// same owner reenters it (count 2), and bob's connection is killed before
/// his reply goes out: the reentered hold is in use and must stay. (Found by
/// the model checker; before the fix the revoke deleted it.)
#[test]
fn a_grant_reentered_by_its_owner_is_not_taken_back_when_the_waiter_leaves() {
    let server = Server::start();
    let (mut c, bob_id, bob) = alice_holds_and_killable_bob_waits(&server);
    let replies: (i64, i64, i64) = redis::pipe()
        .cmd("LOCK.RELEASE")
        .arg(&["k", "alice"])
        .cmd("LOCK.REENTER")
        .arg(&["k", "bob"])
        .cmd("CLIENT")
        .arg(&["KILL", "ID", &bob_id.to_string()])
        .query(&mut c)
        .expect("RELEASE, REENTER, CLIENT KILL");
    assert_eq!(replies, (0, 2, 1));
    // A revoke runs at the end of the event-loop turn that read the
    // pipeline: this next round trip comes after it.
    let info = c.lock_info("k").expect("the reentered hold was taken back");
    assert_eq!((info.owner.as_slice(), info.count), (&b"bob"[..], 2));
    let seen = bob.join().expect("bob's thread");
    assert!(seen.is_err(), "bob's connection was killed, yet: {seen:?}");
}

/// The same, when the owner's other connection reenters and then releases
/// once (reply 1: the owner still holds `k`): once the owner has acted on
/// the lock, the grant to its connection that left is not taken back.
/// (Found by the model checker.)
#[test]
fn a_grant_its_owner_has_used_is_not_taken_back_when_the_waiter_leaves() {
    let server = Server::start();
    let (mut c, bob_id, bob) = alice_holds_and_killable_bob_waits(&server);
    let replies: (i64, i64, i64, i64) = redis::pipe()
        .cmd("LOCK.RELEASE")
        .arg(&["k", "alice"])
        .cmd("LOCK.REENTER")
        .arg(&["k", "bob"])
        .cmd("LOCK.RELEASE")
        .arg(&["k", "bob"])
        .cmd("CLIENT")
        .arg(&["KILL", "ID", &bob_id.to_string()])
        .query(&mut c)
        .expect("RELEASE, REENTER, RELEASE, CLIENT KILL");
    assert_eq!(replies, (0, 2, 1, 1));
    let info = c.lock_info("k").expect("the owner's hold was taken back");
    assert_eq!((info.owner.as_slice(), info.count), (&b"bob"[..], 1));
    let seen = bob.join().expect("bob's thread");
    assert!(seen.is_err(), "bob's connection was killed, yet: {seen:?}");
}
