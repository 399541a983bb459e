//! Random argument vectors ("the server never crashes, whatever the
//! input"). Each vector is a random command of the module, internal
//! `LOCK.APPLY` included, with 0 to 8 random arguments: keys that exist as
//! locks or as other types, owners, keywords, numbers at and past every bound,
//! and random bytes. Any reply is fine, an error too; the connection must stay
//! up and the server alive.
//!
//! The seed is printed; `LOCK_FUZZ_SEED=<seed>` replays a run.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::harness::{Call, Server};

const VECTORS: usize = 4_000;

const COMMANDS: &[&str] = &[
    "LOCK.ACQUIRE",
    "LOCK.REENTER",
    "LOCK.RELEASE",
    "LOCK.RENEW",
    "LOCK.INFO",
    "LOCK.FENCE",
    "LOCK.APPLY",
    "LOCK.LASTFENCE",
    "LOCK.MACQUIRE",
    "LOCK.MRELEASE",
    "LOCK.MRENEW",
    "lock.acquire",
    "lock.release",
];

const WORDS: &[&str] = &[
    "ALL",
    "all",
    "WAIT",
    "wait",
    "PXAT",
    "pxat",
    "PX",
    "EX",
    "NX",
    "",
    " ",
    "SHARED",
    "LIMIT",
    "PERMITS",
    "permits",
    "EPHEMERAL",
];

const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "-1",
    "-0",
    "+1",
    "10",
    "1000",
    "60000",
    "1099511627775",
    "1099511627776",
    "1099511627777",
    "2147483647",
    "2147483648",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999999999999",
    "1.5",
    "1e3",
    "0x10",
    "nan",
    "inf",
    "-inf",
    " 5",
    "5 ",
    "00010",
];

/// Keys: locks that come and go, a string, a list, and a hash.
const KEYS: &[&str] = &["k0", "k1", "k2", "str", "list", "hash"];

const OWNERS: &[&str] = &["o1", "o2", "o\0", "o1\0"];

fn random_arg(rng: &mut StdRng) -> Vec<u8> {
    match rng.gen_range(0..10) {
        0..=2 => KEYS.choose(rng).unwrap().as_bytes().to_vec(),
        3..=4 => OWNERS.choose(rng).unwrap().as_bytes().to_vec(),
        5 => WORDS.choose(rng).unwrap().as_bytes().to_vec(),
        6..=7 => NUMBERS.choose(rng).unwrap().as_bytes().to_vec(),
        8 => rng.gen_range(i64::MIN..=i64::MAX).to_string().into_bytes(),
        _ => {
            let len = match rng.gen_range(0..20) {
                0 => 1024,
                1 => 1025,
                2 => rng.gen_range(1026..5000),
                _ => rng.gen_range(0..24),
            };
            (0..len).map(|_| rng.gen()).collect()
        }
    }
}

/// One random command line.
fn random_vector(rng: &mut StdRng) -> Vec<Vec<u8>> {
    let word = |s: &str| s.as_bytes().to_vec();
    let mut args;
    if rng.gen_bool(0.6) {
        // The shape of a real call, so that many succeed and move state
        // (short leases make some expire while the run goes on).
        let key = word(KEYS[..3].choose(rng).unwrap());
        let owner = word(OWNERS.choose(rng).unwrap());
        let ttl = word(["1", "5", "50", "1000", "60000"].choose(rng).unwrap());
        args = match rng.gen_range(0..5) {
            0 => vec![word("LOCK.ACQUIRE"), key, owner, ttl],
            1 if rng.gen_bool(0.5) => vec![word("LOCK.REENTER"), key, owner, ttl],
            1 => vec![word("LOCK.REENTER"), key, owner],
            2 if rng.gen_bool(0.3) => vec![word("LOCK.RELEASE"), key, owner, word("ALL")],
            2 => vec![word("LOCK.RELEASE"), key, owner],
            3 => vec![word("LOCK.RENEW"), key, owner, ttl],
            _ => vec![word("LOCK.INFO"), key],
        };
        if rng.gen_bool(0.1) {
            args.push(random_arg(rng));
        }
    } else {
        args = vec![word(COMMANDS.choose(rng).unwrap())];
        let count = rng.gen_range(0..=8);
        args.extend((0..count).map(|_| random_arg(rng)));
    }
    // WAIT blocks once it is implemented; `WAIT 0` would block for ever. Any
    // value after WAIT that could read as a number becomes a short wait.
    for i in 1..args.len().saturating_sub(1) {
        if args[i].eq_ignore_ascii_case(b"WAIT") && args[i + 1].iter().any(u8::is_ascii_digit) {
            args[i + 1] = rng.gen_range(1..=5).to_string().into_bytes();
        }
    }
    args
}

#[test]
fn random_argument_vectors_never_crash_the_server() {
    let seed = match std::env::var("LOCK_FUZZ_SEED") {
        Ok(seed) => seed.parse().expect("LOCK_FUZZ_SEED is a u64"),
        Err(_) => rand::random(),
    };
    println!("fuzz seed {seed} (replay: LOCK_FUZZ_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);

    let mut server = Server::start();
    let mut resp2 = server.conn();
    let mut resp3 = server.conn_resp3();
    resp2.value::<String, _>(&["SET", "str", "v"]);
    resp2.int(&["RPUSH", "list", "x"]);
    resp2.int(&["HSET", "hash", "f", "v"]);

    let (mut ok, mut errors) = (0, 0);
    for n in 0..VECTORS {
        let args = random_vector(&mut rng);
        let c = if n % 4 == 0 { &mut resp3 } else { &mut resp2 };
        // `call` panics, naming the command, if the connection drops: that is
        // the failure this test looks for.
        match c.call(&args) {
            Ok(_) => ok += 1,
            Err(_) => errors += 1,
        }
    }
    println!("{ok} replies, {errors} error replies");
    assert!(
        ok > VECTORS / 20,
        "too few calls succeeded to move any state"
    );

    assert!(server.is_alive(), "seed {seed}: redis-server died");
    assert_eq!(resp2.value::<String, _>(&["PING"]), "PONG");
    assert_eq!(resp3.value::<String, _>(&["PING"]), "PONG");
    // Whatever state the run left must save, load and report.
    assert_eq!(resp2.value::<String, _>(&["DEBUG", "RELOAD"]), "OK");
    server.info_field("lock", "lock_held");
    for key in &KEYS[..3] {
        let _ = resp2.call(&["LOCK.INFO", key]);
    }
    assert_eq!(resp2.value::<String, _>(&["PING"]), "PONG");
    assert!(server.is_alive(), "seed {seed}: redis-server died");
}
