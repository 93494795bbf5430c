//! glibc's heap trimming, primed once at server start.
//!
//! glibc hands the top of the heap back to the kernel whenever the free
//! space there passes its trim threshold, and grows the heap again, with a
//! page fault per page, at the next allocation that needs it.  The
//! threshold starts at 128 KiB and adapts: once a process frees a block
//! glibc had to map on its own (one above its 128 KiB mmap threshold), the
//! mmap threshold becomes that block's size and the trim threshold twice
//! that.  A backend whose statements end by freeing a few hundred KiB --
//! a partitioned tail frees about 27 KiB per partition it read -- pays
//! that trim and refill on every statement until something else raises the
//! threshold, and whether it does depends on where its heap happens to
//! end: in the same run one backend trims on every poll and the next never
//! does (bench/README.md, "Heap trimming").
//!
//! So the postmaster frees one such block of 4 MiB as it loads us: every
//! backend it forks starts where a backend that has once freed a 4 MiB
//! block would be (trim threshold 8 MiB, blocks up to 4 MiB from the
//! heap), as glibc itself would have it.  Thresholds set by the user
//! (`MALLOC_TRIM_THRESHOLD_` and friends) switch glibc's adapting off, and
//! this with it.

unsafe extern "C" {
    fn malloc(size: usize) -> *mut std::ffi::c_void;
    fn free(ptr: *mut std::ffi::c_void);
}

/// The block freed: its size sets the thresholds.
const PRIMING_BLOCK: usize = 4 << 20;

/// Frees one block above glibc's mmap threshold, once, at load.
pub fn prime_trim_threshold() {
    // SAFETY: a plain allocation, one byte of it written, and its release.
    unsafe {
        let p = malloc(PRIMING_BLOCK);
        if !p.is_null() {
            // The compiler knows malloc and free, and would drop a block
            // nothing uses: this one must reach glibc.
            std::ptr::write_volatile(p as *mut u8, 0);
            free(std::hint::black_box(p));
        }
    }
}
