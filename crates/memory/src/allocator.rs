//! The process's allocator: mimalloc for all but large blocks, which are anonymous mappings
//! of their own.
//!
//! Why: a FUSE session's every thread held a 16 MiB request buffer (`vec![0; n]`, the size
//! the fuser crate used for the largest write the kernel may send; our own transport since
//! needs 68 KiB per pool thread), of which a read-only file system's requests touch a few KiB. mimalloc zeroes a large block it reuses, so each buffer cost
//! 16 MiB of resident memory, and it kept the blocks once freed: a server with 10 workspaces
//! (20 mounts, 80 FUSE threads) held ~750 MiB, still held after every workspace closed
//! (`cargo bench --bench scale`). A mapping of its own is resident only where written, is
//! zero without being written, and goes back to the system when freed. Blocks this large are
//! rare, so a system call each is nothing beside filling them; small ones keep mimalloc's
//! speed (benches/http_load.rs).

use mimalloc::MiMalloc;
use std::alloc::{GlobalAlloc, Layout};

/// Blocks of at least this size are mappings of their own.
pub const LARGE: usize = 1 << 20;

/// Gives back to the system the pages this thread holds with no block in use (after taking
/// in what other threads freed on them), and every free page of the process's arenas. Another
/// thread's pages are its own to give back ([`crate::idle`]).
pub fn give_back() {
    // SAFETY: mi_collect only walks mimalloc's own bookkeeping; it takes no pointer.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

pub struct Allocator;

fn page() -> usize {
    // SAFETY: sysconf reads a constant of the system; it allocates nothing.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as usize
    } else {
        4096
    }
}

fn rounded(size: usize) -> usize {
    let page = page();
    size.div_ceil(page) * page
}

/// Whether `layout` is served by a mapping: large, and aligned no more than a page.
fn mapped(layout: &Layout) -> bool {
    layout.size() >= LARGE && layout.align() <= page()
}

unsafe fn map(size: usize) -> *mut u8 {
    // SAFETY: a new private anonymous mapping; nothing else refers to its range.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            rounded(size),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p.cast()
    }
}

// SAFETY: every block is served and returned by the same side, chosen by its layout alone
// (the one a caller passes back); a mapping is page-aligned, so any alignment up to a page
// holds.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if mapped(&layout) {
            unsafe { map(layout.size()) }
        } else {
            unsafe { MiMalloc.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if mapped(&layout) {
            // A new anonymous mapping reads as zeros.
            unsafe { map(layout.size()) }
        } else {
            unsafe { MiMalloc.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if mapped(&layout) {
            unsafe { libc::munmap(ptr.cast(), rounded(layout.size())) };
        } else {
            unsafe { MiMalloc.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees new_size, rounded up to the alignment, does not
        // overflow isize.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (mapped(&layout), mapped(&new)) {
            (false, false) => unsafe { MiMalloc.realloc(ptr, layout, new_size) },
            (true, true) => {
                // SAFETY: ptr is a mapping of rounded(layout.size()) bytes made by map.
                let p = unsafe {
                    libc::mremap(
                        ptr.cast(),
                        rounded(layout.size()),
                        rounded(new_size),
                        libc::MREMAP_MAYMOVE,
                    )
                };
                if p == libc::MAP_FAILED {
                    std::ptr::null_mut()
                } else {
                    p.cast()
                }
            }
            // Across the line: a block of the other side, the bytes copied.
            _ => {
                let p = unsafe { self.alloc(new) };
                if !p.is_null() {
                    unsafe {
                        std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                }
                p
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Resident memory is the process's: the tests here take turns.
    pub(crate) static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    /// This process's resident memory, KiB.
    pub(crate) fn rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    #[test]
    fn a_large_block_is_resident_only_where_written_and_returned_when_freed() {
        let _turn = ONE_AT_A_TIME.lock().unwrap();
        let layout = Layout::from_size_align(16 << 20, 8).unwrap();
        let before = rss_kib();
        // A block written whole, then freed: mimalloc alone would keep it, and zero it again
        // (every page resident) for the next block of its size.
        let p = unsafe { Allocator.alloc(layout) };
        assert!(!p.is_null());
        unsafe { std::ptr::write_bytes(p, 0xCD, layout.size()) };
        unsafe { Allocator.dealloc(p, layout) };
        let p = unsafe { Allocator.alloc_zeroed(layout) };
        assert!(!p.is_null());
        let block = unsafe { std::slice::from_raw_parts_mut(p, layout.size()) };
        block[..4096].fill(7);
        let grown = rss_kib().saturating_sub(before);
        assert!(
            block[4096..].iter().all(|b| *b == 0),
            "a new block reads as zeros"
        );
        unsafe { Allocator.dealloc(p, layout) };
        // 32 MiB asked for in all; a page of the second kept, and whatever else the test
        // runner did meanwhile.
        assert!(
            grown < 4096,
            "two 16 MiB blocks, one freed, cost {grown} KiB resident"
        );
    }

    #[test]
    fn blocks_keep_their_bytes_when_grown_or_shrunk_across_the_line() {
        let _turn = ONE_AT_A_TIME.lock().unwrap();
        let small = Layout::from_size_align(4000, 16).unwrap();
        let sizes = [LARGE - 1, LARGE, 3 * LARGE + 5, 40, LARGE * 2];
        let p = unsafe { Allocator.alloc(small) };
        unsafe { std::ptr::write_bytes(p, 0xAB, small.size()) };
        let (mut p, mut layout) = (p, small);
        for size in sizes {
            p = unsafe { Allocator.realloc(p, layout, size) };
            assert!(!p.is_null());
            assert_eq!(p as usize % 16, 0, "alignment kept");
            let kept = layout.size().min(size).min(40);
            let bytes = unsafe { std::slice::from_raw_parts(p, kept) };
            assert!(
                bytes.iter().all(|b| *b == 0xAB),
                "the first bytes kept at {size}"
            );
            layout = Layout::from_size_align(size, 16).unwrap();
            unsafe { std::ptr::write_bytes(p, 0xAB, size) };
        }
        unsafe { Allocator.dealloc(p, layout) };
    }

    #[test]
    fn a_block_aligned_past_a_page_is_mimallocs() {
        let _turn = ONE_AT_A_TIME.lock().unwrap();
        let layout = Layout::from_size_align(2 * LARGE, 1 << 16).unwrap();
        let p = unsafe { Allocator.alloc(layout) };
        assert!(!p.is_null());
        assert_eq!(p as usize % (1 << 16), 0);
        unsafe { Allocator.dealloc(p, layout) };
    }
}
