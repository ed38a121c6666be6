//! A software prefetch: asks the core to start loading a cache line that a lookup a little
//! later will read, without waiting for it.
//!
//! Why an instruction and not a plain load: a load whose value is thrown away still sits in the
//! core's reorder window until its data arrives, so after a couple of hundred instructions the
//! core stalls on it as if it were needed; a prefetch retires at once and the work after it
//! runs at full speed while the line comes in. This is the one `unsafe` of the memstore (the
//! workspace denies it everywhere else): the intrinsic is `unsafe` only because it is declared
//! with a target feature; a prefetch never faults and never writes, and the address here
//! comes from a live reference or from the hash index's hints (addresses remembered from live
//! boxes, possibly stale, only ever prefetched). Elsewhere than x86_64 it does nothing.

/// Starts loading the cache line holding `*r` into every cache level.
#[inline(always)]
pub(crate) fn prefetch<T: ?Sized>(r: &T) {
    prefetch_at((r as *const T).cast::<u8>());
}

/// Starts loading every cache line `*r` spans (an 80-byte slot straddles two or three).
#[inline(always)]
pub(crate) fn prefetch_all<T>(r: &T) {
    let first = (r as *const T).cast::<u8>();
    let mut offset = 0;
    while offset < size_of::<T>() {
        prefetch_at(first.wrapping_add(offset));
        offset += 64;
    }
    prefetch_at(first.wrapping_add(size_of::<T>().saturating_sub(1)));
}

/// Starts loading the cache line at address `addr`, which need not be inside anything live: a
/// hint computed from addresses (the hash index's), never read through.
#[inline(always)]
pub(crate) fn prefetch_line(addr: usize) {
    prefetch_at(std::ptr::without_provenance(addr));
}

#[inline(always)]
#[allow(unsafe_code)]
fn prefetch_at(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` is a hint: it cannot fault or change memory, whatever the address
    // (callers pass addresses inside live references, or `prefetch_line`'s hints, which may be
    // stale); SSE, its target feature, is part of the x86_64 baseline.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
