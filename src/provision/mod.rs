//! Drives as the account holds them: making one (`create`), removing one
//! under its refusals (`delete`), and what a blob is and how its failures
//! read (`checks`). The `create` and `delete` commands and the namespace
//! mount (`mkdir`, `truncate -s`, `rm` in `fs`) call the same functions here,
//! so the size rules, the footer and the refusals have one owner.
//!
//! Invariants: a create never replaces a blob (it is conditional), and one
//! that fails after the blob was made deletes that empty blob again; a
//! delete never removes a leased blob, nor a drive's snapshots unless asked.

pub mod checks;
pub mod create;
pub mod delete;
