//! Tables whose empty state is all zero bytes, allocated in one zeroed call: fresh pages from
//! the allocator are not written at all (the kernel maps them zeroed), so a new table costs
//! nothing until its places are used. The de-duplication window and the hash index use it.

use zerocopy::FromZeros;

/// `n` all-zero `T`s in one zeroed allocation; aborts as `Vec` does when memory runs out.
pub(crate) fn zeroed_table<T: FromZeros>(n: usize) -> Vec<T> {
    T::new_vec_zeroed(n).unwrap_or_else(|_| {
        std::alloc::handle_alloc_error(
            std::alloc::Layout::array::<T>(n)
                .expect("invariant: a table's size fits the address space"),
        )
    })
}
