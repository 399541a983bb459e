//! [`ClockShift`]: steps one server's wall clock, leaving its monotonic
//! clock alone, for the clock-step tests. The server runs with a small
//! preload library (`tests/clockshift/clockshift.c`, built here with the C
//! compiler) that adds an offset to `CLOCK_REALTIME`, `gettimeofday` and
//! `time`; the offset lives in a file the library maps shared, so a
//! [`ClockShift::step`] here shows in the server's very next clock read.
//! libfaketime does the same but hangs Debian's Redis 7.0 (its shared
//! jemalloc), hence the shim.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::bench::compile_preload;

/// The shim's source, compiled once per test process.
const SOURCE: &str = include_str!("../../tests/clockshift/clockshift.c");

/// Gives every offset file of this process its own name.
static FILES: AtomicUsize = AtomicUsize::new(0);

/// The built shim, shared by every server of this process.
fn library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let dir = std::env::temp_dir()
            .join("redislock-tests")
            .join(format!("clockshift-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        compile_preload(&dir, "clockshift", SOURCE, "the clock-shift shim")
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

/// One server's wall-clock offset: give it to
/// [`crate::ServerBuilder::clock_shift`], then [`step`](Self::step) it.
pub struct ClockShift {
    path: PathBuf,
    file: File,
    offset_ms: i64,
}

impl ClockShift {
    /// An offset of 0 (the real wall clock), and the shim built.
    pub fn new() -> Self {
        let library = library();
        let path =
            library.with_file_name(format!("offset-{}", FILES.fetch_add(1, Ordering::Relaxed)));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        let shift = ClockShift {
            path,
            file,
            offset_ms: 0,
        };
        shift.write();
        shift
    }

    /// Moves the server's wall clock by `ms` (negative: back), at once.
    pub fn step(&mut self, ms: i64) {
        self.offset_ms += ms;
        self.write();
    }

    /// How far the server's wall clock is from the real one, in ms.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms
    }

    fn write(&self) {
        self.file
            .write_all_at(&self.offset_ms.to_ne_bytes(), 0)
            .unwrap_or_else(|e| panic!("write {}: {e}", self.path.display()));
    }

    /// The environment a server needs to run under this offset.
    pub(crate) fn env(&self) -> [(&'static str, PathBuf); 2] {
        [
            ("LD_PRELOAD", library().to_path_buf()),
            ("CLOCKSHIFT_FILE", self.path.clone()),
        ]
    }
}

impl Default for ClockShift {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ClockShift {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}
