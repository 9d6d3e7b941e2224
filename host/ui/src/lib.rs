//! wasq-ui: the dashboard's pages, rendered on the server from plain types.
//!
//! The key decision: pages are askama templates compiled into the binary and htmx is
//! vendored ([`assets`]), so the daemon serves its dashboard with no Node at build or run
//! time and nothing fetched from a CDN; live parts of a page re-read the page every two
//! seconds and swap themselves in (htmx `hx-select`), so there is one rendering of each
//! page and no client-side state. Every text a tenant or guest supplied (names, inputs,
//! errors, progress, log lines) is made one line or control-free with `wasq_core::text`,
//! cut to a bound here, and HTML-escaped by askama; templates never mark such text safe.
//!
//! What it is not: HTTP. Sessions, CSRF tokens and reading runs through the API are the
//! server's (`wasq-server`'s `ui` module); this crate turns what the API answered into
//! HTML.

pub mod assets;
mod format;
pub mod pages;
mod timeline;

pub use format::{datetime_local_to_rfc3339, rfc3339_to_datetime_local};
