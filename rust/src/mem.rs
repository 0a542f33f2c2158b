//! The memory guard: sizes are checked before allocating.
//!
//! Every entry point first estimates the peak bytes of the whole call ([`Need`]) and compares
//! them with the machine's physical memory (read once; no limit when unknown): above it, the
//! call fails with [`CoreError::Memory`] before allocating anything. Every allocation that
//! scales with `n`, `d`, `n·d` or `k` then goes through the fallible helpers below
//! (`try_reserve_exact`, `alloc_zeroed`), so an allocation the system refuses anyway is an
//! error too, never an abort. Byte counts are `u128`: products of a few `usize`s and small
//! constants cannot overflow them.

use std::alloc::Layout;
use std::sync::OnceLock;

use crate::error::{format_bytes, CoreError, Result};

/// The machine's physical memory in bytes, `None` when unknown (then nothing is refused in
/// advance).
pub fn physical() -> Option<u128> {
    static PHYSICAL: OnceLock<Option<u128>> = OnceLock::new();
    *PHYSICAL.get_or_init(read_physical)
}

#[cfg(unix)]
fn read_physical() -> Option<u128> {
    // SAFETY: `sysconf` has no preconditions; it returns -1 for an unknown value.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    (pages > 0 && size > 0).then(|| pages as u128 * size as u128)
}

#[cfg(not(unix))]
fn read_physical() -> Option<u128> {
    None
}

/// numpy's name of an element type (for messages).
pub fn dtype_name<T>() -> &'static str {
    match std::any::type_name::<T>() {
        "f64" => "float64",
        "f32" => "float32",
        "i64" => "int64",
        "u64" | "usize" => "uint64",
        "u32" => "uint32",
        "u16" => "uint16",
        "u8" => "uint8",
        "bool" => "bool",
        _ => "records",
    }
}

fn shape_text(shape: &[u128]) -> String {
    match shape {
        [n] => format!("({n},)"),
        _ => format!("({})", shape.iter().map(u128::to_string).collect::<Vec<_>>().join(", ")),
    }
}

/// The bytes of `shape` elements of `size` bytes (saturating: more than any machine has).
fn bytes_of(shape: &[usize], size: usize) -> u128 {
    shape.iter().fold(size as u128, |a, &s| a.saturating_mul(s as u128))
}

/// One array of a call's estimate.
#[derive(Clone, Debug)]
struct Item {
    what: String,
    bytes: u128,
}

/// The estimated peak memory of one call: its arrays (outputs and temporaries).
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct Need {
    items: Vec<Item>,
}

impl Need {
    pub fn new() -> Self {
        Need::default()
    }

    /// An array of `T` of the given shape.
    pub fn array<T>(mut self, what: &str, shape: &[usize]) -> Self {
        let bytes = bytes_of(shape, std::mem::size_of::<T>());
        let shape: Vec<u128> = shape.iter().map(|&s| s as u128).collect();
        self.items.push(Item { what: format!("{what} with shape {} and data type {}", shape_text(&shape), dtype_name::<T>()), bytes });
        self
    }

    /// Unshaped memory (temporaries whose size is only estimated).
    pub fn bytes(mut self, what: &str, bytes: u128) -> Self {
        if bytes > 0 {
            self.items.push(Item { what: what.to_string(), bytes });
        }
        self
    }

    pub fn total(&self) -> u128 {
        self.items.iter().fold(0u128, |t, i| t.saturating_add(i.bytes))
    }

    /// Fails when the estimate exceeds the physical memory, naming the largest array.
    pub fn check(self) -> Result<()> {
        self.check_against(physical())
    }

    fn check_against(self, limit: Option<u128>) -> Result<()> {
        let total = self.total();
        let Some(limit) = limit else { return Ok(()) };
        if total <= limit {
            return Ok(());
        }
        let largest = self.items.iter().max_by_key(|i| i.bytes).cloned().unwrap_or(Item { what: "the result".into(), bytes: total });
        let in_all = if format_bytes(total) != format_bytes(largest.bytes) {
            format!("the call needs {} in all; ", format_bytes(total))
        } else {
            String::new()
        };
        Err(CoreError::Memory {
            what: largest.what,
            bytes: largest.bytes,
            note: format!(" ({in_all}this machine has {} of memory)", format_bytes(limit)),
        })
    }
}

/// The error of a failed allocation of `shape` `T`s.
pub fn alloc_error<T>(what: &str, shape: &[usize]) -> CoreError {
    let bytes = bytes_of(shape, std::mem::size_of::<T>());
    let shape: Vec<u128> = shape.iter().map(|&s| s as u128).collect();
    CoreError::Memory {
        what: format!("{what} with shape {} and data type {}", shape_text(&shape), dtype_name::<T>()),
        bytes,
        note: String::new(),
    }
}

/// Allocations from this size on ask the kernel for transparent huge pages (as numpy does
/// for its arrays): a fresh output then costs a few page faults instead of one per 4 KiB.
const HUGE_PAGE_HINT: usize = 1 << 22;

/// Advises huge pages for the page-aligned interior of a large allocation (a hint: failures
/// are ignored).
fn advise_huge_pages<T>(ptr: *const T, len: usize) {
    let bytes = len.saturating_mul(std::mem::size_of::<T>());
    if bytes < HUGE_PAGE_HINT {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        let start = ptr as usize;
        let aligned = (start + 4095) & !4095;
        let end = start + bytes;
        if aligned < end {
            // SAFETY: `madvise` only advises the kernel about the pages of our own live
            // allocation `[aligned, end)`; MADV_HUGEPAGE never changes their contents.
            unsafe {
                libc::madvise(aligned as *mut libc::c_void, end - aligned, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = ptr;
}

/// An empty vector with room for exactly `len` elements, or [`CoreError::Memory`].
pub fn vec<T>(what: &str, len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| alloc_error::<T>(what, &[len]))?;
    advise_huge_pages(v.as_ptr(), v.capacity());
    Ok(v)
}

/// `len` copies of `value`, allocated fallibly.
pub fn filled<T: Clone>(what: &str, len: usize, value: T) -> Result<Vec<T>> {
    let mut v = vec(what, len)?;
    v.resize(len, value);
    Ok(v)
}

/// The elements of `iter` (at most `len` of them), allocated fallibly once.
pub fn collect<T>(what: &str, len: usize, iter: impl IntoIterator<Item = T>) -> Result<Vec<T>> {
    let mut v = vec(what, len)?;
    v.extend(iter.into_iter().take(len));
    Ok(v)
}

/// A copy of `s`, allocated fallibly.
pub fn copy<T: Clone>(what: &str, s: &[T]) -> Result<Vec<T>> {
    let mut v = vec(what, s.len())?;
    v.extend_from_slice(s);
    Ok(v)
}

/// Element types whose all-zero bit pattern is a valid value (zero).
///
/// # Safety
/// Implement only for types for which all-zero bytes are a valid value.
pub unsafe trait Zeroed: Copy {}
// SAFETY: all-zero bytes are 0 (or 0.0) for these types.
unsafe impl Zeroed for f64 {}
// SAFETY: as above.
unsafe impl Zeroed for f32 {}
// SAFETY: as above.
unsafe impl Zeroed for i64 {}
// SAFETY: as above.
unsafe impl Zeroed for u64 {}
// SAFETY: as above.
unsafe impl Zeroed for usize {}
// SAFETY: as above.
unsafe impl Zeroed for u32 {}
// SAFETY: all-zero bytes are 0.
unsafe impl Zeroed for u16 {}
// SAFETY: all-zero bytes are 0.
unsafe impl Zeroed for u8 {}

/// A zeroed array of the given shape (row-major, `len = Π shape`) from the allocator's zeroed
/// memory (`calloc`: fresh pages are not written twice), or [`CoreError::Memory`].
pub fn zeros<T: Zeroed>(what: &str, shape: &[usize]) -> Result<Vec<T>> {
    let fail = || alloc_error::<T>(what, shape);
    let len = shape.iter().try_fold(1usize, |a, &s| a.checked_mul(s)).ok_or_else(fail)?;
    if len == 0 || std::mem::size_of::<T>() == 0 {
        return Ok(Vec::new());
    }
    let layout = Layout::array::<T>(len).map_err(|_| fail())?;
    // SAFETY: the layout has a non-zero size (len > 0 and T is not zero-sized).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if ptr.is_null() {
        return Err(fail());
    }
    advise_huge_pages(ptr, len);
    // SAFETY: `ptr` comes from the global allocator with `T`'s alignment and room for exactly
    // `len` values (capacity = len, as `Vec` requires); all-zero bytes are valid `T`s (`Zeroed`),
    // so all `len` elements are initialised.
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_refuse_above_the_limit_naming_the_largest_array() {
        let need = Need::new().array::<f64>("the compressed rows", &[100_000, 1_000_000]).array::<f64>("the average", &[1_000_000]);
        let err = need.clone().check_against(Some(1 << 30)).unwrap_err();
        let text = err.to_string();
        assert_eq!(
            text,
            "Unable to allocate 745 GiB for the compressed rows with shape (100000, 1000000) and data type float64 (this machine has 1 GiB of memory)"
        );
        let two = need.clone().bytes("a copy", 800_000_000_000).check_against(Some(1 << 30)).unwrap_err().to_string();
        assert!(two.contains("(the call needs 1.46 TiB in all; this machine has 1 GiB of memory)"), "{two}");
        assert!(need.clone().check_against(None).is_ok());
        assert!(need.check_against(Some(1 << 50)).is_ok());
        // sizes that overflow usize are still counted exactly
        let huge = Need::new().array::<f64>("x", &[usize::MAX, usize::MAX]);
        assert!(huge.total() > u64::MAX as u128);
        assert!(matches!(huge.check(), Err(CoreError::Memory { .. })));
    }

    #[test]
    fn fallible_allocations_fail_cleanly() {
        assert!(matches!(vec::<f64>("x", usize::MAX / 4), Err(CoreError::Memory { .. })));
        assert!(matches!(zeros::<f64>("x", &[usize::MAX / 2, 4]), Err(CoreError::Memory { .. })));
        assert!(matches!(zeros::<f64>("x", &[1 << 60]), Err(CoreError::Memory { .. })));
        let z = zeros::<f64>("x", &[3, 4]).unwrap();
        assert_eq!(z, vec![0.0; 12]);
        assert_eq!(filled("x", 3, 7u32).unwrap(), vec![7, 7, 7]);
        assert!(zeros::<u32>("x", &[0, 5]).unwrap().is_empty());
        assert!(physical().map_or(true, |p| p > 0));
    }
}
