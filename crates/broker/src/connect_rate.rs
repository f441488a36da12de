//! Connect rate per source address (`max_connect_rate_per_ip`, `connect_rate_burst`): a token
//! bucket per IP address, checked when a CONNECT arrives, before its password is checked (so
//! a flood costs no hashing).
//!
//! # Invariants
//! - The map holds at most [`MAX_TRACKED_ADDRESSES`] buckets. When full, buckets that have
//!   refilled (their address is idle) are dropped; if none has, the map is cleared: the limit
//!   then fails open for a moment rather than letting the map grow or refusing everyone.

use std::collections::HashMap;
use std::net::IpAddr;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Source addresses tracked at most.
pub(crate) const MAX_TRACKED_ADDRESSES: usize = 65_536;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Debug, Default)]
pub(crate) struct ConnectRate {
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

impl ConnectRate {
    /// Takes a token for `ip`; false if its bucket is empty. `rate_per_s == 0`: no limit.
    pub(crate) fn admit(&self, ip: IpAddr, rate_per_s: u32, burst: u32, now: Instant) -> bool {
        if rate_per_s == 0 {
            return true;
        }
        let (rate, burst) = (f64::from(rate_per_s), f64::from(burst.max(1)));
        let refilled = |b: &Bucket| {
            let elapsed_s = now.saturating_duration_since(b.at).as_secs_f64();
            (b.tokens + elapsed_s * rate).min(burst)
        };
        let mut buckets = self.buckets.lock();
        if buckets.len() >= MAX_TRACKED_ADDRESSES && !buckets.contains_key(&ip) {
            buckets.retain(|_, b| refilled(b) < burst);
            if buckets.len() >= MAX_TRACKED_ADDRESSES {
                buckets.clear();
            }
        }
        let bucket = buckets.entry(ip).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        bucket.tokens = refilled(bucket);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.buckets.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_rate() {
        let rate = ConnectRate::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let t0 = Instant::now();
        assert!((0..3).all(|_| rate.admit(ip, 2, 3, t0)));
        assert!(!rate.admit(ip, 2, 3, t0));
        // Half a second at 2/s gives one token back.
        assert!(rate.admit(ip, 2, 3, t0 + Duration::from_millis(500)));
        assert!(!rate.admit(ip, 2, 3, t0 + Duration::from_millis(500)));
        // Another address has its own bucket; rate 0 means no limit.
        assert!(rate.admit("10.0.0.2".parse().unwrap(), 2, 3, t0));
        assert!((0..100).all(|_| rate.admit(ip, 0, 1, t0)));
    }

    #[test]
    fn the_map_stays_bounded() {
        let rate = ConnectRate::default();
        let t0 = Instant::now();
        for i in 0..(MAX_TRACKED_ADDRESSES as u32 + 10) {
            let ip = IpAddr::from(i.to_be_bytes());
            rate.admit(ip, 1, 2, t0);
        }
        assert!(rate.tracked() <= MAX_TRACKED_ADDRESSES);
    }
}
