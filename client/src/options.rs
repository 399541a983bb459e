//! How long a lease lasts, how long to wait, whether to renew, and the
//! timing rules derived from them.

use std::time::Duration;

use crate::error::Error;

/// Options of one lock call.
///
/// ```
/// use std::time::Duration;
/// use redislock_client::LockOptions;
/// let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(2));
/// assert_eq!(opts.ttl(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone)]
pub struct LockOptions {
    ttl: Duration,
    wait: Option<Duration>,
    watchdog: bool,
    ephemeral: bool,
}

impl Default for LockOptions {
    /// A 30 s lease, renewed by the watchdog; `lock` waits up to 30 s.
    fn default() -> Self {
        LockOptions::new(Duration::from_secs(30))
    }
}

impl LockOptions {
    /// A lease of `ttl` (at least 1 ms), the watchdog on, `lock` waiting up
    /// to 30 s.
    pub fn new(ttl: Duration) -> LockOptions {
        LockOptions {
            ttl,
            wait: Some(Duration::from_secs(30)),
            watchdog: true,
            ephemeral: false,
        }
    }

    /// How long `lock` waits for the lock before [`Error::TimedOut`].
    pub fn wait(mut self, wait: Duration) -> LockOptions {
        self.wait = Some(wait);
        self
    }

    /// `lock` waits without a time limit.
    pub fn wait_forever(mut self) -> LockOptions {
        self.wait = None;
        self
    }

    /// Turns the watchdog off: the lease is then renewed only by
    /// [`crate::Guard::renew`], and the loss signal fires at the local
    /// deadline unless renewed.
    pub fn watchdog(mut self, on: bool) -> LockOptions {
        self.watchdog = on;
        self
    }

    /// An ephemeral hold (`EPHEMERAL`): bound to a connection of its own,
    /// kept open for the hold's life, the server ends the hold the moment
    /// that connection closes (a crashed process frees the lock at once,
    /// not at its lease end), and the guard's loss signal fires
    /// ([`crate::LossReason::Disconnected`]). The lease still applies. One
    /// server only (not Sentinel or a cluster, whose clients reconnect on
    /// their own): elsewhere the lock call is refused.
    pub fn ephemeral(mut self, on: bool) -> LockOptions {
        self.ephemeral = on;
        self
    }

    pub fn is_ephemeral(&self) -> bool {
        self.ephemeral
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn wait_limit(&self) -> Option<Duration> {
        self.wait
    }

    pub fn has_watchdog(&self) -> bool {
        self.watchdog
    }

    /// The ttl in whole ms, checked: 1 ms to 2^40 ms, as the server accepts.
    pub(crate) fn ttl_ms(&self) -> Result<u64, Error> {
        let ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        if !(1..=MAX_MS).contains(&ms) {
            return Err(Error::InvalidOptions("ttl must be from 1 ms to 2^40 ms"));
        }
        Ok(ms)
    }

    /// The wait in whole ms for the server's `WAIT` (0: no limit).
    pub(crate) fn wait_ms(&self) -> Result<u64, Error> {
        match self.wait {
            None => Ok(0),
            // `WAIT 0` means "forever" to the server: a zero wait is 1 ms.
            Some(wait) => Ok(u64::try_from(wait.as_millis())
                .unwrap_or(u64::MAX)
                .clamp(1, MAX_MS)),
        }
    }
}

/// The server's bound on `ttl-ms` and `timeout-ms`.
const MAX_MS: u64 = 1 << 40;

/// Clock drift allowed for a lease: 1 % of the ttl plus 2 ms (the Redlock
/// design's figure). The local deadline is `send time + ttl − drift`, so the
/// client gives the lock up before any server can have let it go.
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How long a lease of `ttl` sent at `sent` is surely still valid here.
pub(crate) fn deadline(sent: tokio::time::Instant, ttl: Duration) -> tokio::time::Instant {
    sent + ttl.saturating_sub(drift(ttl))
}

/// How often the watchdog renews: every third of the lease, so two renews
/// can fail before the lease ends.
pub(crate) fn renew_period(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}

/// How soon the watchdog tries again after a renew that failed in transit.
pub(crate) fn retry_period(ttl: Duration) -> Duration {
    (ttl / 30).clamp(Duration::from_millis(5), Duration::from_millis(500))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_is_one_percent_plus_two_ms() {
        assert_eq!(drift(Duration::from_secs(10)), Duration::from_millis(102));
        assert_eq!(
            drift(Duration::from_millis(1)),
            Duration::from_micros(2_010)
        );
    }

    #[test]
    fn deadline_never_goes_before_the_send_time() {
        let now = tokio::time::Instant::now();
        assert_eq!(deadline(now, Duration::from_millis(1)), now);
        assert_eq!(
            deadline(now, Duration::from_secs(1)),
            now + Duration::from_millis(988)
        );
    }

    #[test]
    fn ttl_and_wait_are_checked_and_converted() {
        let table = [
            (Duration::ZERO, None),
            (Duration::from_micros(999), None),
            (Duration::from_millis(1), Some(1)),
            (Duration::from_millis(1 << 40), Some(1 << 40)),
            (Duration::from_millis((1 << 40) + 1), None),
        ];
        for (ttl, want) in table {
            assert_eq!(LockOptions::new(ttl).ttl_ms().ok(), want, "{ttl:?}");
        }
        let opts = LockOptions::default();
        assert_eq!(opts.clone().wait_forever().wait_ms().ok(), Some(0));
        assert_eq!(opts.clone().wait(Duration::ZERO).wait_ms().ok(), Some(1));
        assert_eq!(
            opts.wait(Duration::from_secs(2)).wait_ms().ok(),
            Some(2_000)
        );
    }

    #[test]
    fn watchdog_renews_thrice_per_lease_and_retries_sooner() {
        let ttl = Duration::from_secs(3);
        assert_eq!(renew_period(ttl), Duration::from_secs(1));
        assert_eq!(retry_period(ttl), Duration::from_millis(100));
        assert_eq!(
            retry_period(Duration::from_millis(10)),
            Duration::from_millis(5)
        );
    }
}
