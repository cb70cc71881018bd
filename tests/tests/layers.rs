//! The layers over the public API, as a tower user composes them: each alone and each pair
//! (`pairs`), `AllowanceLayer` inheriting the allowance's configuration (`inherit`), the whole
//! stack's bodies and answers (`stack`), and the retry policy over and without an admission
//! layer (`retry`). Virtual time throughout.

mod layers {
    mod inherit;
    mod pairs;
    mod retry;
    mod stack;
}
