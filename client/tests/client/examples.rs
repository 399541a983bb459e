//! The examples, run as processes against a real server.

use std::path::PathBuf;
use std::process::{Command, Output};

use redislock_testkit::Server;

/// An example binary; `cargo test` builds the examples beside the tests.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/client-<hash> → target/<profile>/examples/<name>
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join(name))
        .expect("a target dir");
    assert!(
        path.is_file(),
        "{} not built (cargo test builds it)",
        path.display()
    );
    path
}

fn show(output: &Output) -> String {
    format!(
        "status {}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn inventory_workers_never_oversell() {
    const STOCK: i64 = 300;
    let server = Server::start();
    let _: () = server.q(&["SET", "stock", &STOCK.to_string()]);
    let workers: Vec<_> = (0..6)
        .map(|i| {
            Command::new(example("inventory"))
                .args([server.url(), format!("worker-{i}")])
                .output_async()
        })
        .collect();
    let mut sold = 0;
    for worker in workers {
        let output = worker.wait_with_output().expect("worker ran");
        assert!(output.status.success(), "{}", show(&output));
        let text = String::from_utf8_lossy(&output.stdout);
        let n: i64 = text
            .split_whitespace()
            .last()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count in {text}"));
        sold += n;
    }
    let stock: i64 = server.q(&["GET", "stock"]);
    assert_eq!((stock, sold), (0, STOCK), "stock left and items sold");
    let sales: Vec<String> = server.q(&["LRANGE", "sales", "0", "-1"]);
    assert_eq!(sales.len() as i64, STOCK);
    let fences: Vec<u64> = sales
        .iter()
        .map(|s| {
            s.rsplit(':')
                .next()
                .and_then(|f| f.parse().ok())
                .expect("worker:fence")
        })
        .collect();
    assert!(
        fences.windows(2).all(|w| w[1] > w[0]),
        "fences rise sale by sale"
    );
}

#[test]
fn a_paused_holders_late_write_is_refused() {
    let server = Server::start();
    let output = Command::new(example("paused_holder"))
        .arg(server.url())
        .output()
        .expect("example ran");
    let text = show(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("B's write accepted"), "{text}");
    assert!(text.contains("A's late write refused"), "{text}");
    assert!(text.contains("lock lost locally: true"), "{text}");
}

/// `Command::output` on a spawned child, so several run at once.
trait Spawn {
    fn output_async(&mut self) -> std::process::Child;
}

impl Spawn for Command {
    fn output_async(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn the example")
    }
}
