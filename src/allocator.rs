//! The binary's allocator: mimalloc, asked for word-aligned blocks through its plain entry points.

/// mimalloc, asked as a C program asks it: `mi_malloc` for the word
/// alignment every block of its has, the aligned entry points only above.
/// The `mimalloc` crate's allocator sends every allocation through
/// `mi_malloc_aligned`, whose fast path ends at 1 KiB: each larger block (a
/// request's boxed futures, hyper's read buffers; ~7 per proxied request)
/// took its over-allocating path, ~250 instructions, and `mi_free` then
/// looked for the block's start (callgrind).
pub struct Mimalloc;

/// The alignment of every block `mi_malloc` returns (a machine word).
const MI_WORD_ALIGN: usize = std::mem::size_of::<usize>();

// SAFETY: each call is mimalloc's own for the same layout: a pointer from
// `mi_malloc`/`mi_zalloc`/`mi_realloc` is word-aligned, which is all the
// layouts sent there ask for; every other layout goes to the aligned entry
// points, as `mimalloc::MiMalloc` sends them all; `mi_free` frees either.
unsafe impl std::alloc::GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_malloc, mi_malloc_aligned};
        match layout.align() <= MI_WORD_ALIGN {
            true => mi_malloc(layout.size()).cast(),
            false => mi_malloc_aligned(layout.size(), layout.align()).cast(),
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_zalloc, mi_zalloc_aligned};
        match layout.align() <= MI_WORD_ALIGN {
            true => mi_zalloc(layout.size()).cast(),
            false => mi_zalloc_aligned(layout.size(), layout.align()).cast(),
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        libmimalloc_sys::mi_free(ptr.cast());
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        use libmimalloc_sys::{mi_realloc, mi_realloc_aligned};
        match layout.align() <= MI_WORD_ALIGN {
            true => mi_realloc(ptr.cast(), new_size).cast(),
            false => mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout};

    #[test]
    fn every_block_has_the_alignment_its_layout_asks_and_keeps_its_bytes_when_resized() {
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for size in [
                1, 7, 8, 20, 24, 48, 100, 1000, 1024, 1025, 5728, 11_040, 70_000,
            ] {
                let layout = Layout::from_size_align(size, align).expect("a layout");
                // SAFETY: a non-zero size; each block is freed with its layout.
                unsafe {
                    let p = Mimalloc.alloc(layout);
                    assert!(
                        !p.is_null() && (p as usize).is_multiple_of(align),
                        "{size} at {align}"
                    );
                    p.write_bytes(0xa5, size);
                    let q = Mimalloc.realloc(p, layout, size * 2);
                    assert!(
                        (q as usize).is_multiple_of(align),
                        "resized {size} at {align}"
                    );
                    let kept = std::slice::from_raw_parts(q, size);
                    assert!(kept.iter().all(|b| *b == 0xa5), "{size} at {align} kept");
                    Mimalloc.dealloc(q, Layout::from_size_align(size * 2, align).unwrap());
                    let z = Mimalloc.alloc_zeroed(layout);
                    assert!((z as usize).is_multiple_of(align));
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|b| *b == 0));
                    Mimalloc.dealloc(z, layout);
                }
            }
        }
    }
}
