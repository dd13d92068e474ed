//! The dashboard's and `/metrics`' door: the cluster token, as on the
//! node's other ports, given as `Authorization: Bearer TOKEN` (scrapers,
//! the page's own requests) or `?token=TOKEN` (the link a person opens;
//! the page then sends it as the header). Compared in constant time.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Shared;

/// Whether a request with this `Authorization` header and query string
/// may pass a node whose token is `expected` (`None`: no token needed).
pub(super) fn allowed(expected: Option<&str>, authorization: Option<&[u8]>, query: Option<&str>) -> bool {
    let Some(expected) = expected else { return true };
    let equal = |got: &[u8]| store_client::dataplane::wire::tokens_equal(got, expected.as_bytes());
    if let Some(got) = authorization.and_then(|h| h.strip_prefix(b"Bearer ")) {
        return equal(got);
    }
    query.into_iter().flat_map(|q| q.split('&')).filter_map(|kv| kv.strip_prefix("token=")).any(|t| equal(&percent_decoded(t)))
}

/// `%XX` escapes and `+` of a query value decoded (a token may hold
/// characters a browser escapes).
fn percent_decoded(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let hex = |i: usize| b.get(i..i + 2).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (b[i], hex(i + 1)) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (c, _) => out.push(c),
        }
        i += 1;
    }
    out
}

/// Middleware: 401 for a request without the token, before any handler.
pub(super) async fn require_token(State(shared): State<Shared>, req: Request, next: Next) -> Response {
    let authorization = req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
    if allowed(shared.token.as_deref(), authorization, req.uri().query()) {
        return next.run(req).await;
    }
    let body = "this store node needs the cluster token: open the dashboard as /?token=TOKEN, \
                or send `Authorization: Bearer TOKEN` (for /metrics, the scraper's bearer token)\n";
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_passes_in_the_header_or_the_query_and_nothing_else_does() {
        let t = Some("s3cret/+x");
        assert!(allowed(None, None, None), "a node without a token lets everyone in");
        assert!(allowed(t, Some(b"Bearer s3cret/+x"), None));
        assert!(!allowed(t, Some(b"Bearer s3cret"), None));
        assert!(!allowed(t, Some(b"s3cret/+x"), None), "the scheme is part of the header");
        assert!(allowed(t, None, Some("a=1&token=s3cret%2F%2Bx")));
        assert!(!allowed(t, None, Some("token=s3cret")));
        assert!(!allowed(t, None, Some("xtoken=s3cret%2F%2Bx")));
        assert!(!allowed(t, None, None));
        // A wrong header is not rescued by a right query: one answer per request.
        assert!(!allowed(t, Some(b"Bearer nope"), Some("token=s3cret%2F%2Bx")));
    }

    #[test]
    fn a_broken_escape_is_kept_as_it_is() {
        assert_eq!(percent_decoded("a%2"), b"a%2");
        assert_eq!(percent_decoded("%zz"), b"%zz");
        assert_eq!(percent_decoded("%41+"), b"A ");
    }
}
