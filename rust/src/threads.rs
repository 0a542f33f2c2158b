//! The core's own rayon thread pool: every parallel kernel runs inside it, so its size is set
//! here ([`set_num_threads`]) without touching rayon's global pool. Kernels split their work
//! by sizes, never by the number of threads, and reduce in a fixed order: results never depend
//! on the pool's size.

use std::cell::Cell;
use std::sync::{Arc, RwLock};

use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::error::{CoreError, Result};

/// The largest pool [`set_num_threads`] builds.
pub const MAX_THREADS: usize = 1024;

static POOL: RwLock<Option<Arc<ThreadPool>>> = RwLock::new(None);

fn build(threads: Option<usize>) -> Result<Arc<ThreadPool>> {
    let mut b = ThreadPoolBuilder::new().thread_name(|i| format!("permk-{i}"));
    if let Some(k) = threads {
        b = b.num_threads(k);
    }
    b.build().map(Arc::new).map_err(|e| CoreError::Threads(e.to_string()))
}

/// The pool, built on first use with rayon's default size (`RAYON_NUM_THREADS`, else one
/// thread per logical CPU).
pub fn pool() -> Result<Arc<ThreadPool>> {
    if let Some(p) = POOL.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return Ok(Arc::clone(p));
    }
    let mut slot = POOL.write().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = slot.as_ref() {
        return Ok(Arc::clone(p));
    }
    let p = build(None)?;
    *slot = Some(Arc::clone(&p));
    Ok(p)
}

/// Replaces the pool by one of `k` threads (`1 <= k <= MAX_THREADS`). Calls already running
/// finish on the old pool.
pub fn set_num_threads(k: usize) -> Result<()> {
    if !(1..=MAX_THREADS).contains(&k) {
        return Err(CoreError::invalid("k", format!("the number of threads must be in [1, {MAX_THREADS}], got {k}")));
    }
    let p = build(Some(k))?;
    *POOL.write().unwrap_or_else(|e| e.into_inner()) = Some(p);
    Ok(())
}

/// The number of threads of the pool.
pub fn num_threads() -> Result<usize> {
    Ok(pool()?.current_num_threads())
}

/// Whether `parts` independent parts of `work` values in all are worth spreading over the pool:
/// at least two parts and `min_work` values, more than one thread (on a pool of one the work
/// would only move to another thread, away from the caches the caller has just filled), and
/// not inside [`on_caller`].
pub fn spread(parts: usize, work: usize, min_work: usize) -> Result<bool> {
    Ok(parts >= 2 && work >= min_work && !ON_CALLER.with(Cell::get) && num_threads()? > 1)
}

thread_local! {
    /// Set while [`on_caller`] runs on this thread.
    static ON_CALLER: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every kernel that asks [`spread`] kept on the calling thread: for a caller
/// that spreads its own work over threads (the linear autoencoder's blocks, one per Python
/// thread, each with its BLAS product and its pass on one core). Values never depend on it.
pub fn on_caller<R>(f: impl FnOnce() -> R) -> R {
    /// Restores the flag however `f` ends.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ON_CALLER.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(ON_CALLER.with(|c| c.replace(true)));
    f()
}

/// Runs `f` inside the pool (directly when already on one of its threads).
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> Result<R> {
    Ok(pool()?.install(f))
}

/// Serialises the tests that resize the pool.
#[cfg(test)]
pub(crate) static TEST_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn the_pool_can_be_resized() {
        let _lock = TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        assert!(set_num_threads(0).is_err());
        assert!(set_num_threads(MAX_THREADS + 1).is_err());
        let sum = |_: ()| install(|| (0..10_000u64).into_par_iter().map(|v| v * v).sum::<u64>()).unwrap();
        let before = sum(());
        set_num_threads(1).unwrap();
        assert_eq!(num_threads().unwrap(), 1);
        assert_eq!(install(rayon::current_num_threads).unwrap(), 1);
        assert_eq!(sum(()), before);
        assert!(!spread(10, 1 << 20, 1).unwrap());
        set_num_threads(3).unwrap();
        assert!(spread(10, 1 << 20, 1).unwrap());
        assert!(!spread(1, 1 << 20, 1).unwrap() && !spread(10, 5, 6).unwrap());
        assert_eq!(num_threads().unwrap(), 3);
        assert_eq!(sum(()), before);
    }

    #[test]
    fn on_caller_keeps_kernels_on_the_calling_thread_until_it_returns() {
        let _lock = TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        set_num_threads(3).unwrap();
        assert!(on_caller(|| !spread(10, 1 << 20, 1).unwrap() && on_caller(|| !spread(10, 1 << 20, 1).unwrap())));
        assert!(spread(10, 1 << 20, 1).unwrap());
        // another thread is not affected, and the flag is restored after a panic
        assert!(on_caller(|| std::thread::scope(|s| s.spawn(|| spread(10, 1 << 20, 1).unwrap()).join().unwrap())));
        assert!(std::panic::catch_unwind(|| on_caller(|| panic!("inside"))).is_err());
        assert!(spread(10, 1 << 20, 1).unwrap());
    }
}
