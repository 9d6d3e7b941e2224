//! Progress shown by `wasq run --wait`, the API and the dashboard.

use crate::bindings::wasq::task::progress as wit;

/// Reports that the run is `percent` done (values above 100 are sent as 100), with an
/// optional message such as `Some("fetched 40 of 80 pages")`.
///
/// Progress is not durable state: code outside steps re-runs on a retry, so a later attempt
/// may report lower figures again.
pub fn report(percent: u8, message: Option<&str>) {
    wit::report(percent.min(100), message);
}
