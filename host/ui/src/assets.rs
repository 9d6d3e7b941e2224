//! Static files under `/ui/assets/`, compiled in. Their names carry a version (htmx) or
//! change with the binary, so they may be cached for a day.

/// The file `name`: its content type and bytes.
pub fn get(name: &str) -> Option<(&'static str, &'static [u8])> {
    Some(match name {
        // htmx 2.0.11 from npm (htmx.org, BSD Zero Clause; htmx-LICENSE beside it).
        "htmx-2.0.11.min.js" => (
            "text/javascript; charset=utf-8",
            include_bytes!("../assets/htmx-2.0.11.min.js"),
        ),
        "app.css" => (
            "text/css; charset=utf-8",
            include_bytes!("../assets/app.css"),
        ),
        _ => return None,
    })
}
