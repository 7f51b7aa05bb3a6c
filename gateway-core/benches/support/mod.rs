//! What the benchmarks share: knobs from the environment and latency percentiles.

use std::time::Duration;

pub fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number, not {v:?}")),
        Err(_) => default,
    }
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

/// What an open loop did: how long it ran, and the latest a tick fired after it was due.
pub struct OpenLoop {
    pub seconds: f64,
    pub max_lag: Duration,
}

/// An open loop: `rate` calls per second whatever the answers, for `duration`, issued in 1 ms
/// ticks (tokio's timer granularity), call `i` on its own task running `call(i)`. A late tick
/// issues everything due by then, so the rate holds.
pub async fn open_loop<F, Fut>(rate: u64, duration: Duration, mut call: F) -> OpenLoop
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let started = tokio::time::Instant::now();
    let total = rate * duration.as_millis() as u64 / 1000;
    let mut issued = 0u64;
    let mut max_lag = Duration::ZERO;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut handles = Vec::new();
    while issued < total {
        let now = tick.tick().await;
        let elapsed = now.duration_since(started);
        let due = (rate * elapsed.as_micros() as u64 / 1_000_000 + 1).min(total);
        max_lag = max_lag.max(tokio::time::Instant::now().duration_since(now));
        while issued < due {
            handles.push(tokio::spawn(call(issued)));
            issued += 1;
        }
        if handles.len() > 4096 {
            for h in handles.drain(..) {
                h.await.expect("bench task");
            }
        }
    }
    for h in handles {
        h.await.expect("bench task");
    }
    OpenLoop {
        seconds: started.elapsed().as_secs_f64(),
        max_lag,
    }
}
